//! Running commands: `shell` (shell protocol v2 when the device has `shell_v2`,
//! with separate stdout/stderr and an exit status) and `exec` (raw bytes).

use bytes::{Bytes, BytesMut};
use oxadb_wire::feature;
use oxadb_wire::service::{DeviceService, ShellMode, ShellProtocol, ShellService};
use oxadb_wire::shell::{encode_frame, DeviceOutput, DeviceOutputReader, FrameId};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::byte_stream::BoxedStream;
use crate::device::Device;
use crate::error::{Error, Result};

/// What a finished command produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShellOutput {
    pub stdout: Vec<u8>,
    /// Empty without shell protocol v2, where stderr arrives mixed into stdout.
    pub stderr: Vec<u8>,
    /// The remote exit status; 0 when the device cannot report it (no `shell_v2`).
    pub exit_code: i32,
}

/// How to start a shell session.
#[derive(Debug, Clone, Default)]
pub struct ShellOptions {
    /// Allocate a pseudo-terminal on the device.
    pub pty: bool,
    /// `TERM` for the remote side (sent only with shell protocol v2).
    pub term: Option<String>,
    /// Never use shell protocol v2, even when the device offers it (`adb
    /// shell -x`): stderr mixed into stdout, no exit status.
    pub no_v2: bool,
    /// Send neither `raw` nor `pty` and let the device choose, as adb's
    /// `send_shell_command` (logcat) does (client/commandline.cpp).
    pub default_type: bool,
}

/// One piece of output from a [`ShellSession`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShellEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(i32),
}

/// A running command with streamed input and output. Use [`ShellSession::into_split`]
/// to feed input and read output concurrently.
pub struct ShellSession {
    reader: ShellReader,
    writer: ShellWriter,
}

/// The input side of a [`ShellSession`].
pub struct ShellWriter {
    writer: WriteHalf<BoxedStream>,
    protocol_v2: bool,
    label: String,
}

/// The output side of a [`ShellSession`].
pub struct ShellReader {
    reader: ReadHalf<BoxedStream>,
    protocol_v2: bool,
    device_output: DeviceOutputReader,
    finished: bool,
    label: String,
    /// Tells a lost connection from a finished command; a stream an adb
    /// server relays has none (the server's own end says nothing more).
    connection: Option<oxadb_io::Connection>,
    serial: String,
}

/// The service for `command`, as adb asks for it: without shell protocol
/// v2 no arguments at all, with it `TERM` and the type (unless the device
/// is to choose).
pub fn shell_service(command: &str, options: &ShellOptions, v2: bool) -> DeviceService {
    let shell = if v2 {
        ShellService {
            protocol: ShellProtocol::V2,
            term: options.term.clone(),
            mode: (!options.default_type).then_some(if options.pty {
                ShellMode::Pty
            } else {
                ShellMode::Raw
            }),
            command: command.to_string(),
        }
    } else {
        ShellService {
            protocol: ShellProtocol::V1,
            term: None,
            mode: None,
            command: command.to_string(),
        }
    };
    DeviceService::Shell(shell)
}

impl Device {
    /// Starts `command` (an interactive shell when empty).
    pub async fn shell_session(
        &self,
        command: &str,
        options: &ShellOptions,
    ) -> Result<ShellSession> {
        let v2 = !options.no_v2 && self.has_feature(feature::SHELL_V2);
        let service = shell_service(command, options, v2);
        let stream = self.open(&service).await?;
        let mut session = ShellSession::over_stream(Box::new(stream), v2, self.serial(), command);
        session.reader.connection = Some(self.connection().clone());
        Ok(session)
    }

    /// Runs `command` to completion and collects its output and exit status.
    pub async fn shell(&self, command: &str) -> Result<ShellOutput> {
        let mut session = self
            .shell_session(command, &ShellOptions::default())
            .await?;
        // A command that needs no input may have finished and closed the
        // stream already; its output and exit status are still to be read.
        let _ = session.close_stdin().await;
        let mut output = ShellOutput::default();
        while let Some(event) = session.next_event().await? {
            match event {
                ShellEvent::Stdout(data) => output.stdout.extend_from_slice(&data),
                ShellEvent::Stderr(data) => output.stderr.extend_from_slice(&data),
                ShellEvent::Exit(code) => output.exit_code = code,
            }
        }
        Ok(output)
    }

    /// Runs `command` with `exec:` (no pty, no framing: binary-safe) and returns its output.
    pub async fn exec(&self, command: &str) -> Result<Vec<u8>> {
        let mut stream = self.open(&DeviceService::Exec(command.to_string())).await?;
        let mut output = Vec::new();
        stream
            .read_to_end(&mut output)
            .await
            .map_err(|e| Error::io(format!("{}: exec {command:?}", self.serial()), e))?;
        Ok(output)
    }
}

impl ShellSession {
    /// A session on a shell service already opened on `stream` (`v2`: the
    /// service asked for is `shell,v2,...`), e.g. one an adb server relays.
    pub fn over_stream(stream: BoxedStream, v2: bool, serial: &str, command: &str) -> ShellSession {
        let (reader, writer) = tokio::io::split(stream);
        let label = format!("{serial}: shell {command:?}");
        ShellSession {
            reader: ShellReader {
                reader,
                protocol_v2: v2,
                device_output: DeviceOutputReader::new(),
                finished: false,
                label: label.clone(),
                connection: None,
                serial: serial.to_string(),
            },
            writer: ShellWriter {
                writer,
                protocol_v2: v2,
                label,
            },
        }
    }

    /// Whether the session speaks shell protocol v2 (exit status, separate stderr).
    pub fn is_v2(&self) -> bool {
        self.writer.protocol_v2
    }

    pub fn into_split(self) -> (ShellReader, ShellWriter) {
        (self.reader, self.writer)
    }

    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<()> {
        self.writer.write_stdin(data).await
    }

    pub async fn close_stdin(&mut self) -> Result<()> {
        self.writer.close_stdin().await
    }

    pub async fn next_event(&mut self) -> Result<Option<ShellEvent>> {
        self.reader.next_event().await
    }
}

impl ShellWriter {
    fn io_error(&self, error: std::io::Error) -> Error {
        Error::io(self.label.clone(), error)
    }

    /// Sends bytes to the command's stdin.
    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<()> {
        let result = if self.protocol_v2 {
            let mut frame = BytesMut::with_capacity(data.len() + 5);
            encode_frame(FrameId::Stdin, data, &mut frame)
                .map_err(|e| Error::protocol(self.label.clone(), "shell", e.to_string()))?;
            self.writer.write_all(&frame).await
        } else {
            self.writer.write_all(data).await
        };
        result.map_err(|e| self.io_error(e))
    }

    /// Signals end of input (v2 close-stdin; without v2 nothing can be sent, as in adb).
    pub async fn close_stdin(&mut self) -> Result<()> {
        if self.protocol_v2 {
            let mut frame = BytesMut::new();
            encode_frame(FrameId::CloseStdin, &[], &mut frame)
                .map_err(|e| Error::protocol(self.label.clone(), "shell", e.to_string()))?;
            self.writer
                .write_all(&frame)
                .await
                .map_err(|e| self.io_error(e))?;
        }
        Ok(())
    }

    /// Tells the remote pty its new size (v2 only).
    pub async fn resize(
        &mut self,
        rows: u16,
        cols: u16,
        x_pixels: u16,
        y_pixels: u16,
    ) -> Result<()> {
        if !self.protocol_v2 {
            return Ok(());
        }
        let payload = format!("{rows}x{cols},{x_pixels}x{y_pixels}\0");
        let mut frame = BytesMut::new();
        encode_frame(FrameId::WindowSizeChange, payload.as_bytes(), &mut frame)
            .map_err(|e| Error::protocol(self.label.clone(), "shell", e.to_string()))?;
        self.writer
            .write_all(&frame)
            .await
            .map_err(|e| self.io_error(e))
    }

    /// Closes the stream (the remote command gets SIGHUP if still running).
    pub async fn close(mut self) {
        let _ = self.writer.shutdown().await;
    }
}

impl ShellReader {
    fn io_error(&self, error: std::io::Error) -> Error {
        Error::io(self.label.clone(), error)
    }

    /// The device broke shell protocol v2 on this session's stream.
    fn protocol_error(&self, message: String) -> Error {
        Error::protocol(self.label.clone(), "shell", message)
    }

    /// The next piece of output; `None` once the command finished and the
    /// stream closed.
    pub async fn next_event(&mut self) -> Result<Option<ShellEvent>> {
        loop {
            if self.protocol_v2 {
                match self.device_output.next_output() {
                    Ok(Some(DeviceOutput::Stdout(data))) => {
                        return Ok(Some(ShellEvent::Stdout(data)))
                    }
                    Ok(Some(DeviceOutput::Stderr(data))) => {
                        return Ok(Some(ShellEvent::Stderr(data)))
                    }
                    Ok(Some(DeviceOutput::Exit(code))) => {
                        return Ok(Some(ShellEvent::Exit(i32::from(code))))
                    }
                    Ok(None) => {}
                    Err(error) => return Err(self.protocol_error(error.to_string())),
                }
            }
            if self.finished {
                // The stream's end is only a command's end if the connection
                // still stands and, with v2, an exit frame came first (adb's
                // `shell_protocol` ends every command with one).
                if let Some(connection) = &self.connection {
                    if let Some(lost) = crate::device::lost(connection, &self.serial) {
                        return Err(lost);
                    }
                }
                if self.protocol_v2 && !self.device_output.exited() {
                    return Err(Error::ConnectionLost {
                        addr: self.serial.clone(),
                        reason: format!(
                            "{} ended without an exit status",
                            self.label.trim_start_matches(&format!("{}: ", self.serial))
                        ),
                    });
                }
                return Ok(None);
            }
            let mut buf = vec![0u8; 64 * 1024];
            let n = self
                .reader
                .read(&mut buf)
                .await
                .map_err(|e| self.io_error(e))?;
            if n == 0 {
                self.finished = true;
                continue;
            }
            buf.truncate(n);
            if self.protocol_v2 {
                self.device_output.feed(&buf);
            } else {
                return Ok(Some(ShellEvent::Stdout(Bytes::from(buf))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_follow_adb() {
        let raw = ShellOptions::default();
        assert_eq!(
            shell_service("ls", &raw, true).to_string(),
            "shell,v2,raw:ls"
        );
        assert_eq!(shell_service("ls", &raw, false).to_string(), "shell:ls");
        let pty = ShellOptions {
            pty: true,
            term: Some("xterm-256color".into()),
            ..ShellOptions::default()
        };
        assert_eq!(
            shell_service("", &pty, true).to_string(),
            "shell,v2,TERM=xterm-256color,pty:"
        );
        // adb's logcat: TERM but no type, so the device picks.
        let logcat = ShellOptions {
            term: Some("xterm".into()),
            default_type: true,
            ..ShellOptions::default()
        };
        assert_eq!(
            shell_service("exec logcat", &logcat, true).to_string(),
            "shell,v2,TERM=xterm:exec logcat"
        );
    }
}
