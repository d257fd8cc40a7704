//! `STAT`, `LST2`, `STA2`, `LIST` and `LIS2`: the file system looked at on a
//! blocking thread (`oxadb_transfer::serve`), the reply written by the
//! machine.

use std::path::PathBuf;

use oxadb_io::{ReadChunk, WriteChunk};
use oxadb_transfer::{serve, StatKind};
use tokio::io::{AsyncRead, AsyncWrite};

use super::{blocking, Conn};

impl<S: AsyncRead + AsyncWrite + ReadChunk + WriteChunk + Unpin + Send> Conn<S> {
    pub(super) async fn stat(&mut self, kind: StatKind, path: PathBuf) {
        let result = blocking(move || serve::stat(kind, &path)).await;
        self.service.stat_done(result);
    }

    pub(super) async fn list(&mut self, dir: PathBuf) {
        let entries = blocking(move || serve::list(&dir)).await;
        self.service.list_done(entries);
    }
}
