//! How a received file's destination failed: the step and its cause, shared
//! by the temporary entry beside it and the destination itself (each role
//! words the failure its own way from the step).

use std::fmt;
use std::io;
use std::path::PathBuf;

/// The step of a destination's life that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Making the temporary file (or the destination is a directory).
    Create,
    /// Making the missing parent directory named.
    CreateDir(PathBuf),
    /// Opening a destination that is written in place.
    OpenInPlace,
    /// Writing the data (also copying into a busy destination).
    Write,
    /// Giving the file its mode or times.
    Attributes,
    /// Renaming the temporary file over the destination.
    Replace,
    /// Flushing the finished file to storage (where a full disk or a failing
    /// one may show first, with delayed allocation).
    SyncFile,
    /// Flushing the directory that got the new entry (named).
    SyncDir(PathBuf),
}

/// A failed destination step and its cause; each role words it its own way.
#[derive(Debug)]
pub struct DestError {
    pub step: Step,
    pub error: io::Error,
}

impl DestError {
    pub(crate) fn new(step: Step, error: io::Error) -> DestError {
        DestError { step, error }
    }
}

impl fmt::Display for DestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.step {
            Step::CreateDir(dir) => {
                write!(
                    f,
                    "couldn't create directory '{}': {}",
                    dir.display(),
                    self.error
                )
            }
            Step::SyncDir(dir) => {
                write!(
                    f,
                    "couldn't sync directory '{}': {}",
                    dir.display(),
                    self.error
                )
            }
            _ => self.error.fmt(f),
        }
    }
}

impl std::error::Error for DestError {}
