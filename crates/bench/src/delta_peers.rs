//! The tools `oxadb-bench delta` sets beside oxadb: rsync over an sshd of
//! its own, and bmaptool fetching an image over HTTP from Python's
//! `http.server`; installed from Debian's packages when missing.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use crate::emulated::{run_bounded_cpu, Background};
use crate::emulator;

pub(crate) const SSHD: &str = "/usr/sbin/sshd";
/// Debian's interpreter, the one bmaptool runs on (not whatever `python3`
/// comes first on PATH).
pub(crate) const PYTHON: &str = "/usr/bin/python3";
/// sshd refuses to start without its privilege separation directory, which
/// the package's service would make.
const PRIVSEP_DIR: &str = "/run/sshd";

/// What the installed tools are and can do.
pub(crate) struct Tools {
    pub(crate) rsync_version: String,
    /// rsync's `--compress-choice` lists zstd (on both ends: the same binary).
    pub(crate) rsync_zstd: bool,
    pub(crate) ssh_version: String,
    pub(crate) bmaptool_version: String,
    /// bmaptool decompressed a `.zst` image in the probe.
    pub(crate) bmaptool_zstd: bool,
}

/// Whether `name` is an executable file in a PATH directory (`command -v`).
fn on_path(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(name))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Processes named sshd now running.
fn sshd_pids() -> HashSet<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            (comm.trim() == "sshd").then_some(pid)
        })
        .collect()
}

/// Installs what the rsync and bmaptool ways and the XFS target need when it is missing
/// (`apt-get update` once, then `apt-get install -y`), failing loudly if
/// that fails. An sshd that appears during the install was started by the
/// package's scripts: it is stopped by pid and said so.
pub(crate) fn install_missing(rsync: bool, bmaptool: bool, xfs: bool, log: &Path) -> Result<()> {
    let mut packages = Vec::new();
    if xfs && !on_path("mkfs.xfs") {
        packages.push("xfsprogs");
    }
    if rsync {
        if !Path::new(SSHD).exists() {
            packages.push("openssh-server");
        }
        if !on_path("rsync") {
            packages.push("rsync");
        }
        if !on_path("ssh") || !on_path("ssh-keygen") {
            packages.push("openssh-client");
        }
    }
    if bmaptool {
        if !on_path("bmaptool") {
            packages.push("bmap-tools");
        }
        if !Path::new(PYTHON).exists() {
            packages.push("python3");
        }
        // bmaptool decompresses .zst through the zstd program.
        if !on_path("zstd") {
            packages.push("zstd");
        }
    }
    if packages.is_empty() {
        return Ok(());
    }
    eprintln!("installing {} (apt-get)", packages.join(" "));
    let before = sshd_pids();
    let apt = |args: &[&str], what: &str| -> Result<()> {
        let mut command = Command::new("apt-get");
        command.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        run_bounded_cpu(&mut command, Duration::from_secs(900), what, log)
            .with_context(|| format!("{what} failed: install {} by hand", packages.join(" ")))?;
        Ok(())
    };
    apt(&["update"], "apt-get update")?;
    let mut install = vec!["install", "-y"];
    install.extend(&packages);
    let installed = apt(&install, "apt-get install");
    for pid in sshd_pids().difference(&before) {
        // Nothing of ours runs sshd yet: it is the package's service.
        eprintln!("the openssh-server package started a system sshd (pid {pid}): stopping it");
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGTERM) };
    }
    installed?;
    for (name, present) in [
        ("sshd", !rsync || Path::new(SSHD).exists()),
        ("rsync", !rsync || on_path("rsync")),
        ("bmaptool", !bmaptool || on_path("bmaptool")),
        ("mkfs.xfs", !xfs || on_path("mkfs.xfs")),
    ] {
        ensure!(present, "{name} is still missing after apt-get install");
    }
    Ok(())
}

/// stdout and stderr of a short command that must succeed within a
/// minute; `scratch` holds them meanwhile.
fn output_of(command: &mut Command, what: &str, scratch: &Path) -> Result<String> {
    let (_, text, _) = run_bounded_cpu(command, Duration::from_secs(60), what, scratch)?;
    Ok(text)
}

/// The tools' versions, and whether each reads zstd; `dir` is scratch space
/// for bmaptool's probe.
pub(crate) fn inspect(rsync: bool, bmaptool: bool, dir: &Path) -> Result<Tools> {
    let mut tools = Tools {
        rsync_version: String::new(),
        rsync_zstd: false,
        ssh_version: String::new(),
        bmaptool_version: String::new(),
        bmaptool_zstd: false,
    };
    let scratch = dir.join("version.txt");
    if rsync {
        let text = output_of(
            Command::new("rsync").arg("--version"),
            "rsync --version",
            &scratch,
        )?;
        tools.rsync_version = text.lines().next().unwrap_or_default().trim().to_string();
        tools.rsync_zstd = compress_list(&text).iter().any(|c| c == "zstd");
        // `ssh -V` prints to stderr.
        tools.ssh_version = output_of(Command::new("ssh").arg("-V"), "ssh -V", &scratch)?
            .trim()
            .to_string();
    }
    if bmaptool {
        tools.bmaptool_version = output_of(
            Command::new("bmaptool").arg("--version"),
            "bmaptool --version",
            &scratch,
        )?
        .trim()
        .to_string();
        tools.bmaptool_zstd = bmaptool_reads_zstd(dir)?;
    }
    Ok(tools)
}

/// The words after "Compress list:" in `rsync --version`.
fn compress_list(version: &str) -> Vec<String> {
    let mut lines = version
        .lines()
        .skip_while(|l| !l.contains("Compress list:"));
    let Some(first) = lines.next() else {
        return Vec::new();
    };
    // 3.2 prints the list on the next line, indented; some builds on the same one.
    let same_line = first.split_once(':').map_or("", |(_, rest)| rest);
    let next = lines.next().filter(|l| l.starts_with(' ')).unwrap_or("");
    same_line
        .split_whitespace()
        .chain(next.split_whitespace())
        .map(str::to_string)
        .collect()
}

/// Copies a small zstd-compressed image with `bmaptool copy --nobmap` from
/// a local file: true if it comes out whole (the HTTP fetch goes through
/// the same decompression).
fn bmaptool_reads_zstd(dir: &Path) -> Result<bool> {
    let probe = dir.join("bmaptool-probe");
    std::fs::create_dir_all(&probe)?;
    let data: Vec<u8> = (0..1u32 << 18).map(|i| (i % 251) as u8).collect();
    let compressed = probe.join("probe.img.zst");
    std::fs::write(&compressed, zstd::bulk::compress(&data, 3)?)?;
    let copy = probe.join("probe.img");
    let result = run_bounded_cpu(
        Command::new("bmaptool")
            .args(["copy", "--nobmap"])
            .arg(&compressed)
            .arg(&copy),
        Duration::from_secs(60),
        "bmaptool copy of a .zst image",
        &probe.join("output.txt"),
    );
    let read_back = std::fs::read(&copy).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&probe);
    Ok(result.is_ok() && read_back == data)
}

/// Makes sshd's privilege separation directory if it is missing, and
/// removes it again on drop (only then).
pub(crate) struct PrivsepDir {
    made: bool,
}

impl PrivsepDir {
    pub(crate) fn ensure() -> Result<PrivsepDir> {
        let path = Path::new(PRIVSEP_DIR);
        if path.is_dir() {
            return Ok(PrivsepDir { made: false });
        }
        std::fs::create_dir(path).with_context(|| format!("creating {PRIVSEP_DIR}"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
        emulator::register_path(path);
        Ok(PrivsepDir { made: true })
    }
}

impl Drop for PrivsepDir {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir(PRIVSEP_DIR);
            emulator::forget_path(Path::new(PRIVSEP_DIR));
        }
    }
}

/// The sshd's host key and the client's key, made for this run only.
pub(crate) struct SshKeys {
    dir: PathBuf,
    host_key: PathBuf,
    pub(crate) client_key: PathBuf,
    authorized_keys: PathBuf,
    pub(crate) known_hosts: PathBuf,
}

impl SshKeys {
    pub(crate) fn make(dir: &Path) -> Result<SshKeys> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let keys = SshKeys {
            dir: dir.to_path_buf(),
            host_key: dir.join("host_ed25519"),
            client_key: dir.join("client_ed25519"),
            authorized_keys: dir.join("authorized_keys"),
            known_hosts: dir.join("known_hosts"),
        };
        for key in [&keys.host_key, &keys.client_key] {
            output_of(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", "oxadb-bench", "-f"])
                    .arg(key),
                "ssh-keygen",
                &dir.join("ssh-keygen.txt"),
            )?;
        }
        std::fs::copy(keys.client_key.with_extension("pub"), &keys.authorized_keys)?;
        Ok(keys)
    }

    /// An sshd configuration listening on `addr:port` only, letting root
    /// in with the client key alone.
    pub(crate) fn write_config(&self, name: &str, addr: &str, port: u16) -> Result<PathBuf> {
        let path = self.dir.join(format!("sshd_config-{name}"));
        let text = format!(
            "ListenAddress {addr}:{port}\n\
             HostKey {host_key}\n\
             AuthorizedKeysFile {authorized_keys}\n\
             PidFile none\n\
             AllowUsers root\n\
             PermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\n\
             PasswordAuthentication no\n\
             KbdInteractiveAuthentication no\n\
             UsePAM no\n\
             # The work dir sits in the world-writable /dev/shm.\n\
             StrictModes no\n\
             PermitUserRC no\n\
             PermitUserEnvironment no\n\
             AllowAgentForwarding no\n\
             AllowTcpForwarding no\n\
             X11Forwarding no\n\
             PrintMotd no\n\
             UseDNS no\n\
             # Debian's bash reads ~/.bashrc for a command run by sshd unless it\n\
             # is nested: the receiver starts without this machine's profile.\n\
             SetEnv SHLVL=1\n",
            host_key = self.host_key.display(),
            authorized_keys = self.authorized_keys.display(),
        );
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// The `-e` of rsync: ssh with none of the machine's configuration,
    /// keys, agent or known hosts.
    pub(crate) fn ssh_command(&self, port: u16) -> String {
        format!(
            "ssh -F none -i {key} -p {port} -o IdentitiesOnly=yes -o IdentityAgent=none \
             -o StrictHostKeyChecking=no -o UserKnownHostsFile={known} \
             -o GlobalKnownHostsFile={known} -o BatchMode=yes -o LogLevel=ERROR",
            key = self.client_key.display(),
            known = self.known_hosts.display(),
        )
    }
}

/// Starts sshd (`command` is /usr/sbin/sshd on the device side) in the
/// foreground on `port`, logging to `log`.
pub(crate) fn start_sshd(
    mut command: Command,
    config: &Path,
    port: u16,
    log: &Path,
) -> Result<Background> {
    command
        .args(["-D", "-e", "-f"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    Background::spawn_listening(&mut command, port, Duration::from_secs(10), "sshd").with_context(
        || {
            format!(
                "sshd's log: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        },
    )
}

/// Starts `python3 -m http.server` (`command` is PYTHON on the host side)
/// serving `dir` on `addr:port`.
pub(crate) fn start_http_server(
    mut command: Command,
    addr: &str,
    port: u16,
    dir: &Path,
    log: &Path,
) -> Result<Background> {
    command
        .args(["-m", "http.server", "--bind", addr, "--directory"])
        .arg(dir)
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
    Background::spawn_listening(&mut command, port, Duration::from_secs(10), "http.server")
}

/// `bmaptool create` of `image` into `bmap`.
pub(crate) fn create_bmap(image: &Path, bmap: &Path, log: &Path) -> Result<()> {
    run_bounded_cpu(
        Command::new("bmaptool")
            .args(["create", "-o"])
            .arg(bmap)
            .arg(image),
        Duration::from_secs(600),
        "bmaptool create",
        log,
    )?;
    Ok(())
}

/// "Total bytes sent" plus "Total bytes received" from `rsync --stats`
/// (numbers may carry thousands separators).
pub(crate) fn rsync_bytes(text: &str) -> Result<u64> {
    let number = |label: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(label))?;
        let digits: String = line[label.len()..]
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    match (number("Total bytes sent:"), number("Total bytes received:")) {
        (Some(sent), Some(received)) => Ok(sent + received),
        _ => bail!("no byte counts in rsync's --stats: {text}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rsync_stats_with_separators() {
        let text = "Literal data: 1,234 bytes\nTotal bytes sent: 12,345,678\nTotal bytes received: 9,876\n";
        assert_eq!(super::rsync_bytes(text).unwrap(), 12_345_678 + 9_876);
    }

    #[test]
    fn rsync_compress_list_on_the_next_line() {
        let text = "rsync  version 3.2.7  protocol version 31\nCompress list:\n    zstd lz4 zlibx zlib none\nDaemon auth list:\n    sha512\n";
        assert_eq!(
            super::compress_list(text),
            ["zstd", "lz4", "zlibx", "zlib", "none"]
        );
    }
}
