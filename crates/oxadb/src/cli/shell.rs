//! `oxadb shell` and `oxadb exec-out`.

use std::io::Write;

use anyhow::Context;
use oxadb::shell::{ShellEvent, ShellOptions};
use oxadb::DeviceService;

use super::endpoint::Endpoint;
use rustix::termios;
use tokio::io::AsyncReadExt;

#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    /// Allocate a pty if stdin is a terminal; twice (-tt) to force one.
    #[arg(short = 't', action = clap::ArgAction::Count)]
    pty: u8,
    /// Never allocate a pty.
    #[arg(short = 'T', conflicts_with = "pty")]
    no_pty: bool,
    /// Do not read stdin (as if it were /dev/null).
    #[arg(short = 'n')]
    no_stdin: bool,
    /// No shell protocol: stderr mixed into stdout, exit status always 0
    /// (adb's -x, for old devices' behaviour).
    #[arg(short = 'x')]
    no_shell_protocol: bool,
    /// Escape character for an interactive pty session, or `none`; accepted
    /// for adb compatibility, oxadb handles no escape sequences.
    #[arg(short = 'e', value_name = "ESC")]
    escape: Option<String>,
    /// Command to run; an interactive login shell when omitted. Words are
    /// joined with spaces and interpreted by the device's shell, as adb does.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ExecOutArgs {
    /// Command to run with `exec:` (no pty, binary-safe output).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Restores the terminal's settings when dropped.
struct RawTerminal {
    saved: termios::Termios,
}

impl RawTerminal {
    fn enable() -> rustix::io::Result<RawTerminal> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, termios::OptionalActions::Flush, &raw)?;
        Ok(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(
            std::io::stdin(),
            termios::OptionalActions::Flush,
            &self.saved,
        );
    }
}

fn window_size() -> Option<termios::Winsize> {
    termios::tcgetwinsize(std::io::stdout()).ok()
}

/// Runs a shell command; returns the exit status to exit with (the remote one).
pub async fn shell(device: &Endpoint, args: &ShellArgs) -> anyhow::Result<i32> {
    let command = args.command.join(" ");
    let stdin_tty = !args.no_stdin && termios::isatty(std::io::stdin());
    if args.pty == 1 && !stdin_tty {
        // adb's words (client/commandline.cpp).
        eprintln!("Remote PTY will not be allocated because stdin is not a terminal.");
        eprintln!("Use multiple -t options to force remote PTY allocation.");
    }
    // adb's rule: a pty for an interactive shell on a terminal; -t asks for one
    // when stdin is a terminal, -tt forces one, -T refuses one.
    let pty =
        !args.no_pty && (args.pty >= 2 || (stdin_tty && (command.is_empty() || args.pty == 1)));
    let options = ShellOptions {
        pty,
        term: std::env::var("TERM").ok(),
        no_v2: args.no_shell_protocol,
        default_type: false,
    };
    run(device, &command, &options, !args.no_stdin).await
}

/// `oxadb logcat [ARGS]`: adb's service line, `export ANDROID_LOG_TAGS=...;
/// exec logcat ARGS` with every word quoted (client/commandline.cpp), run
/// with the device's default shell type; stdin is not read.
pub async fn logcat(device: &Endpoint, args: &[String]) -> anyhow::Result<i32> {
    let tags = std::env::var("ANDROID_LOG_TAGS").unwrap_or_default();
    let mut command = format!("export ANDROID_LOG_TAGS=\"{}\"; exec logcat", quote(&tags));
    for arg in args {
        command.push(' ');
        command.push_str(&quote(arg));
    }
    let options = ShellOptions {
        pty: false,
        term: std::env::var("TERM").ok(),
        no_v2: false,
        default_type: true,
    };
    run(device, &command, &options, false).await
}

/// Single-quotes a word for the device's shell, as adb's `escape_arg`.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

async fn run(
    device: &Endpoint,
    command: &str,
    options: &ShellOptions,
    read_stdin: bool,
) -> anyhow::Result<i32> {
    let pty = options.pty;
    let stdin_tty = read_stdin && termios::isatty(std::io::stdin());
    let session = device.shell_session(command, options).await?;
    let v2 = session.is_v2();
    let (mut reader, mut writer) = session.into_split();
    let _raw = if pty && stdin_tty {
        Some(RawTerminal::enable().context("putting the terminal in raw mode")?)
    } else {
        None
    };
    if pty {
        if let Some(size) = window_size() {
            writer
                .resize(size.ws_row, size.ws_col, size.ws_xpixel, size.ws_ypixel)
                .await?;
        }
    }
    // Without shell protocol v2 nothing can signal end of input, so stdin is
    // only forwarded when it is a terminal or v2 is available (adb does the same).
    let forward_stdin = read_stdin && (v2 || stdin_tty);
    let close_at_once = !read_stdin && v2;
    let input = tokio::spawn(async move {
        let mut winch =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        if close_at_once {
            let _ = writer.close_stdin().await;
        }
        if forward_stdin {
            loop {
                tokio::select! {
                    n = stdin.read(&mut buf) => match n {
                        Ok(0) | Err(_) => {
                            let _ = writer.close_stdin().await;
                            break;
                        }
                        Ok(n) => {
                            if writer.write_stdin(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    },
                    Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => None } } => {
                        if let Some(size) = window_size() {
                            let _ = writer.resize(size.ws_row, size.ws_col, size.ws_xpixel, size.ws_ypixel).await;
                        }
                    }
                }
            }
        }
        // Keep the stream open until the output side finishes.
        std::future::pending::<()>().await;
    });
    let mut exit_code = 0;
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    while let Some(event) = reader.next_event().await? {
        match event {
            ShellEvent::Stdout(data) => {
                stdout.write_all(&data)?;
                stdout.flush()?;
            }
            ShellEvent::Stderr(data) => {
                stderr.write_all(&data)?;
                stderr.flush()?;
            }
            ShellEvent::Exit(code) => exit_code = code,
        }
    }
    input.abort();
    Ok(exit_code)
}

/// Copies a command's raw output to stdout.
pub async fn exec_out(device: &Endpoint, args: &ExecOutArgs) -> anyhow::Result<i32> {
    let command = args.command.join(" ");
    let mut stream = device.open(&DeviceService::Exec(command.clone())).await?;
    let mut stdout = tokio::io::stdout();
    tokio::io::copy(&mut stream, &mut stdout)
        .await
        .with_context(|| format!("{}: exec-out {command:?}", device.serial()))?;
    use tokio::io::AsyncWriteExt;
    stdout.flush().await?;
    // A device that went away also ends the stream: that is no success.
    if let Some(lost) = device.lost() {
        return Err(lost.into());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn words_are_quoted_as_adbs_escape_arg() {
        assert_eq!(super::quote(""), "''");
        assert_eq!(super::quote("-d"), "'-d'");
        assert_eq!(super::quote("it's"), "'it'\\''s'");
    }
}
