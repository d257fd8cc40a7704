//! `oxadb shell` and `oxadb exec-out`.

use std::io::Write;

use anyhow::Context;
use oxadb::shell::{ShellEvent, ShellOptions};
use oxadb::Device;
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
pub async fn shell(device: &Device, args: &ShellArgs) -> anyhow::Result<i32> {
    let command = args.command.join(" ");
    let stdin_tty = termios::isatty(std::io::stdin());
    // adb's rule: a pty for an interactive shell on a terminal; -t asks for one
    // when stdin is a terminal, -tt forces one, -T refuses one.
    let pty =
        !args.no_pty && (args.pty >= 2 || (stdin_tty && (command.is_empty() || args.pty == 1)));
    let options = ShellOptions {
        pty,
        term: std::env::var("TERM").ok(),
    };
    let session = device.shell_session(&command, &options).await?;
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
    let forward_stdin = v2 || stdin_tty;
    let input = tokio::spawn(async move {
        let mut winch =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
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
pub async fn exec_out(device: &Device, args: &ExecOutArgs) -> anyhow::Result<i32> {
    let command = args.command.join(" ");
    let mut stream = device.open(&format!("exec:{command}")).await?;
    let mut stdout = tokio::io::stdout();
    tokio::io::copy(&mut stream, &mut stdout)
        .await
        .with_context(|| format!("{}: exec-out {command:?}", device.serial()))?;
    use tokio::io::AsyncWriteExt;
    stdout.flush().await?;
    Ok(0)
}
