//! Recognises the few Android commands oxadbd answers itself when the device
//! has no such program (`logcat`, `getprop`, `setprop`) in a `shell:`/`exec:`
//! command line, and routes it: to the login shell, to a system-log reader,
//! or to an answer made here. The words of the line are read by
//! `invocation`; `logcat` and `props` serve what is recognised.

use super::invocation::{self, find_program, Answer};
use super::logcat;
use super::props::{self, Properties};

/// What the shell service does with a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Run it with the login shell, as given.
    Shell,
    /// Run this command line instead (a system-log reader for `logcat`).
    Replace(String),
    /// Answer without running anything.
    Answer(Answer),
}

/// Decides how `command` is served. `path` is the PATH the command would
/// be looked up in: a real program of the same name always wins.
pub fn route(command: &str, properties: &Properties, path: &str) -> Route {
    let Some(invocation) = invocation::parse(command) else {
        return Route::Shell;
    };
    if !matches!(
        invocation.program.as_str(),
        "logcat" | "getprop" | "setprop"
    ) || find_program(&invocation.program, path).is_some()
    {
        return Route::Shell;
    }
    match invocation.program.as_str() {
        "logcat" => match logcat::plan(&invocation, &logcat::Source::detect()) {
            Ok(line) => Route::Replace(line),
            Err(answer) => Route::Answer(answer),
        },
        "getprop" => Route::Answer(props::getprop(properties, &invocation.args)),
        _ => Route::Answer(props::setprop(&invocation.args)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_like_lines_run_in_the_shell() {
        let props = Properties::default();
        assert_eq!(route("ls -l", &props, ""), Route::Shell);
        assert_eq!(route("getprop | cat", &props, ""), Route::Shell);
    }

    #[test]
    fn a_real_program_on_the_path_wins() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("getprop");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        let props = Properties::default();
        let path = dir.path().to_str().unwrap();
        // Not executable: not a program.
        assert!(matches!(route("getprop", &props, path), Route::Answer(_)));
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(route("getprop", &props, path), Route::Shell);
        assert_eq!(find_program("getprop", path), Some(program));
    }
}
