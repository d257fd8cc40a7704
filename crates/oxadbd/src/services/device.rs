//! Android's device-control services: `reboot:TARGET`, and the answers to
//! `root:`, `unroot:`, `remount:`, `enable-verity:` and `disable-verity:`,
//! which have nothing to change on a Linux device.

use std::path::Path;
use std::time::Duration;

use oxadb_wire::service::DeviceService;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// How long after the stream's end the reboot command runs: the host's
/// adb sees the stream close and returns first, as with an Android device
/// that goes down after answering.
const REBOOT_DELAY: Duration = Duration::from_secs(1);

/// What `root:`, `unroot:`, `remount:`, `enable-verity:` or
/// `disable-verity:` answer; `None` for other services. A daemon running as
/// root is an eng build's adbd (always root, `ro.secure=0`), one running as
/// another user a user build's; the words are adbd's for those cases (AOSP
/// daemon/restart_service.cpp, daemon/remount_service.cpp and
/// set_verity_enable_state_service.cpp before they moved out of adbd),
/// except `unroot` on a root daemon, where adbd would restart as a user
/// and no text of its applies. None says "restarting", so adb prints the
/// line and exits 0 without waiting for the device to come back
/// (client/commandline.cpp `adb_root`).
pub fn answer(service: &DeviceService, root: bool) -> Option<&'static str> {
    use DeviceService::*;
    Some(match (service, root) {
        (Root, true) => "adbd is already running as root\n",
        (Root, false) => "adbd cannot run as root in production builds\n",
        (Unroot, true) => "adbd cannot run as non root: oxadbd keeps the user it was started as\n",
        (Unroot, false) => "adbd not running as root\n",
        (Remount(_), true) => {
            "remount is not needed: oxadbd does not mount partitions read-only; \
             use `adb shell mount -o remount,rw PATH` for a read-only mount\n"
        }
        (Remount(_), false) => "Not running as root. Try \"adb root\" first.\n",
        (EnableVerity | DisableVerity, true) => "verity not enabled - ENG build\n",
        (EnableVerity | DisableVerity, false) => "verity cannot be disabled/enabled - USER build\n",
        _ => return None,
    })
}

/// The command `reboot:` runs: `configured` split on blanks; by default
/// `systemctl reboot` where systemd is the init system, else `reboot`.
/// Empty: rebooting is turned off.
pub fn reboot_command(configured: Option<&str>) -> Vec<String> {
    match configured {
        Some(line) => line.split_whitespace().map(str::to_string).collect(),
        // systemd's documented test for "booted with systemd" (sd_booted(3)).
        None if Path::new("/run/systemd/system").is_dir() => {
            vec!["systemctl".into(), "reboot".into()]
        }
        None => vec!["reboot".into()],
    }
}

/// Serves `reboot:TARGET`: answers (nothing on success, as adbd), closes
/// the stream, then runs `command` with TARGET as its last argument when
/// TARGET is not empty (`bootloader`, `recovery`, ...) and in
/// `OXADBD_REBOOT_TARGET` always.
pub async fn reboot<S: AsyncWrite + Unpin>(mut stream: S, target: &str, command: Vec<String>) {
    let refusal = if command.is_empty() {
        Some("reboot is turned off on this device (oxadbd's reboot-command is empty)\n".into())
    } else if !target
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_,.".contains(c))
    {
        Some(format!("reboot ({target}) failed: invalid reboot target\n"))
    } else {
        None
    };
    if let Some(text) = refusal {
        tracing::warn!(target, "reboot refused: {}", text.trim_end());
        let _ = stream.write_all(text.as_bytes()).await;
        let _ = stream.shutdown().await;
        return;
    }
    let _ = stream.shutdown().await;
    drop(stream);
    tokio::time::sleep(REBOOT_DELAY).await;
    let mut child = tokio::process::Command::new(&command[0]);
    child
        .args(&command[1..])
        .args((!target.is_empty()).then_some(target))
        .env("OXADBD_REBOOT_TARGET", target)
        .stdin(std::process::Stdio::null())
        .process_group(0);
    let line = format!(
        "{}{}",
        command.join(" "),
        if target.is_empty() {
            String::new()
        } else {
            format!(" {target}")
        }
    );
    tracing::warn!(command = %line, "reboot requested by the host");
    match child.status().await {
        Ok(status) if status.success() => tracing::info!(command = %line, "reboot command done"),
        Ok(status) => tracing::warn!(command = %line, %status, "reboot command failed"),
        Err(error) => tracing::warn!(command = %line, %error, "cannot run the reboot command"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_to(service: &str, root: bool) -> Option<&'static str> {
        answer(&service.parse().unwrap(), root)
    }

    #[test]
    fn answers_are_adbds_own_words() {
        assert_eq!(
            answer_to("root:", true),
            Some("adbd is already running as root\n")
        );
        assert_eq!(
            answer_to("unroot:", false),
            Some("adbd not running as root\n")
        );
        assert_eq!(
            answer_to("disable-verity:", true),
            Some("verity not enabled - ENG build\n")
        );
        assert_eq!(
            answer_to("remount:-R", false),
            Some("Not running as root. Try \"adb root\" first.\n")
        );
        assert_eq!(answer_to("shell:", true), None);
        for service in ["root:", "unroot:", "remount:", "enable-verity:", "root"] {
            for root in [true, false] {
                // adb waits for the device to restart after "restarting".
                assert!(!answer_to(service, root).unwrap().contains("restarting"));
            }
        }
    }

    #[test]
    fn reboot_commands_split_on_blanks() {
        assert_eq!(
            reboot_command(Some("/usr/local/bin/fake-reboot --now")),
            ["/usr/local/bin/fake-reboot", "--now"]
        );
        assert!(reboot_command(Some("  ")).is_empty());
        assert!(!reboot_command(None).is_empty());
    }
}
