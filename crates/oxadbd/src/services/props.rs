//! Android system properties for `getprop`, on a device that has none:
//! the banner's product properties, values read from the machine, fixed
//! answers tools probe for, and the config file's `[properties]` table,
//! which wins. docs/protocol.md, "Properties", says where each comes from.

use std::collections::BTreeMap;

use super::invocation::Answer;

/// The properties `getprop` lists, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties(pub BTreeMap<String, String>);

/// What the device is, for the computed properties.
#[derive(Debug, Clone)]
pub struct Identity<'a> {
    pub product_name: &'a str,
    pub product_model: &'a str,
    pub product_device: &'a str,
    /// The daemon's effective uid is 0.
    pub root: bool,
    /// `uname -m`.
    pub machine: &'a str,
}

/// The SDK level and release reported by default: Android 12 (API 31) is
/// the first whose adbd has every protocol feature oxadbd advertises
/// (`sendrecv_v2` with brotli, lz4 and zstd), so tools that gate adb
/// features on the SDK level use exactly those.
pub const DEFAULT_SDK: &str = "31";
pub const DEFAULT_RELEASE: &str = "12";

impl Properties {
    /// The computed properties, then `configured` over them.
    pub fn new(identity: &Identity, configured: &BTreeMap<String, String>) -> Properties {
        let mut props = BTreeMap::new();
        let mut set = |key: &str, value: String| {
            props.insert(key.to_string(), value);
        };
        set("ro.product.name", identity.product_name.to_string());
        set("ro.product.model", identity.product_model.to_string());
        set("ro.product.device", identity.product_device.to_string());
        set("ro.product.manufacturer", manufacturer());
        set("ro.product.brand", identity.product_name.to_string());
        set("ro.serialno", serial_number(identity.product_device));
        set("ro.build.version.sdk", DEFAULT_SDK.into());
        set("ro.build.version.release", DEFAULT_RELEASE.into());
        let abi = android_abi(identity.machine);
        set("ro.product.cpu.abi", abi.to_string());
        set("ro.product.cpu.abilist", abi.to_string());
        set("ro.hardware", identity.machine.to_string());
        // A root adbd is what an eng build (ro.secure=0) runs; a non-root
        // one what a user build runs, where `adb root` is refused.
        let (secure, debuggable, build_type) = if identity.root {
            ("0", "1", "eng")
        } else {
            ("1", "0", "user")
        };
        set("ro.secure", secure.into());
        set("ro.adb.secure", secure.into());
        set("ro.debuggable", debuggable.into());
        set("ro.build.type", build_type.into());
        // adbd runs as root from the start, not after `adb root`, as on an
        // eng build (AOSP daemon/restart_service.cpp sets it to 1 on `adb root`).
        set("service.adb.root", "0".into());
        set("sys.boot_completed", "1".into());
        set("dev.bootcomplete", "1".into());
        set("init.svc.bootanim", "stopped".into());
        set("ro.kernel.qemu", "0".into());
        set("ro.build.characteristics", "default".into());
        if let Some(zone) = timezone() {
            set("persist.sys.timezone", zone);
        }
        for (key, value) in configured {
            props.insert(key.clone(), value.clone());
        }
        Properties(props)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// `getprop` (every property as `[name]: [value]`, sorted as Android's
/// toybox getprop lists them), `getprop NAME` (its value, or an empty line)
/// and `getprop NAME DEFAULT`.
pub fn getprop(props: &Properties, args: &[String]) -> Answer {
    if let Some(option) = args.iter().find(|arg| arg.starts_with('-')) {
        return Answer::fail(format!(
            "getprop: option {option} is not supported: oxadbd answers getprop from its \
             own property list (no SELinux contexts or types); usage: getprop [NAME [DEFAULT]]\n"
        ));
    }
    match args {
        [] => Answer::out(
            props
                .0
                .iter()
                .map(|(key, value)| format!("[{key}]: [{value}]\n"))
                .collect::<String>(),
        ),
        [name] => Answer::out(format!("{}\n", props.get(name).unwrap_or(""))),
        [name, default] => Answer::out(format!("{}\n", props.get(name).unwrap_or(default))),
        _ => Answer::fail("getprop: too many arguments; usage: getprop [NAME [DEFAULT]]\n"),
    }
}

/// `setprop`: refused, the properties being fixed by the configuration.
pub fn setprop(args: &[String]) -> Answer {
    let what = match args {
        [name, value] => format!("'{name}' to '{value}'"),
        _ => "a property".to_string(),
    };
    Answer::fail(format!(
        "setprop: cannot set {what}: oxadbd's properties are read-only; set them in the \
         [properties] table of its config file (/etc/oxadbd/oxadbd.toml) and restart it\n"
    ))
}

/// Android's ABI name for a kernel machine name (`uname -m`).
pub fn android_abi(machine: &str) -> &str {
    match machine {
        "x86_64" => "x86_64",
        "i386" | "i486" | "i586" | "i686" => "x86",
        "aarch64" | "arm64" | "aarch64_be" => "arm64-v8a",
        "armv7l" | "armv8l" | "armv7" => "armeabi-v7a",
        "armv5tel" | "armv6l" | "arm" => "armeabi",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// The first readable, non-empty line of `paths`.
fn first_line(paths: &[&str]) -> Option<String> {
    paths.iter().find_map(|path| {
        let raw = std::fs::read(path).ok()?;
        let text = String::from_utf8_lossy(&raw);
        let line = text
            .trim_matches(|c: char| c == '\0' || c.is_whitespace())
            .lines()
            .next()?
            .trim()
            .to_string();
        (!line.is_empty()).then_some(line)
    })
}

/// The board's serial number (device tree, as on a Raspberry Pi; DMI),
/// else the first 16 digits of the machine id, else `fallback`.
fn serial_number(fallback: &str) -> String {
    first_line(&[
        "/sys/firmware/devicetree/base/serial-number",
        "/sys/class/dmi/id/product_serial",
    ])
    .or_else(|| first_line(&["/etc/machine-id"]).map(|id| id.chars().take(16).collect()))
    .unwrap_or_else(|| fallback.to_string())
}

/// DMI's system vendor, else the device tree's first compatible vendor.
fn manufacturer() -> String {
    first_line(&["/sys/class/dmi/id/sys_vendor"])
        .or_else(|| {
            let raw = std::fs::read("/sys/firmware/devicetree/base/compatible").ok()?;
            let first = raw.split(|&b| b == 0).next()?;
            let text = String::from_utf8_lossy(first);
            let vendor = text.split(',').next()?.trim().to_string();
            (!vendor.is_empty()).then_some(vendor)
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// The Olson name of the local time zone (/etc/timezone, or where the
/// /etc/localtime link points).
fn timezone() -> Option<String> {
    first_line(&["/etc/timezone"]).or_else(|| {
        let target = std::fs::read_link("/etc/localtime").ok()?;
        let target = target.to_string_lossy().into_owned();
        let (_, zone) = target.split_once("zoneinfo/")?;
        Some(zone.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(root: bool) -> Identity<'static> {
        Identity {
            product_name: "debian",
            product_model: "Board X",
            product_device: "kiosk",
            root,
            machine: "aarch64",
        }
    }

    #[test]
    fn configured_properties_win_and_everything_lists_sorted() {
        let configured = BTreeMap::from([
            ("ro.build.version.sdk".to_string(), "33".to_string()),
            ("vendor.site".to_string(), "lab 2".to_string()),
        ]);
        let props = Properties::new(&identity(true), &configured);
        assert_eq!(props.get("ro.product.model"), Some("Board X"));
        assert_eq!(props.get("ro.product.cpu.abi"), Some("arm64-v8a"));
        assert_eq!(props.get("ro.build.version.sdk"), Some("33"));
        assert_eq!(props.get("ro.secure"), Some("0"));
        let all = getprop(&props, &[]).stdout;
        assert!(all.contains("[vendor.site]: [lab 2]\n"), "{all}");
        assert!(all.starts_with("[dev.bootcomplete]: [1]\n"), "{all}");
        let one = getprop(&props, &["ro.product.device".into()]);
        assert_eq!(one, Answer::out("kiosk\n"));
        assert_eq!(getprop(&props, &["no.such".into()]), Answer::out("\n"));
        assert_eq!(
            getprop(&props, &["no.such".into(), "dflt".into()]),
            Answer::out("dflt\n")
        );
        assert_eq!(getprop(&props, &["-Z".into()]).status, 1);
        let user = Properties::new(&identity(false), &BTreeMap::new());
        assert_eq!(user.get("ro.debuggable"), Some("0"));
    }

    #[test]
    fn setprop_fails_naming_the_property() {
        let answer = setprop(&["x".into(), "y".into()]);
        assert_eq!(answer.status, 1);
        assert!(answer
            .stderr
            .starts_with("setprop: cannot set 'x' to 'y': "));
        assert!(answer.stdout.is_empty());
    }

    #[test]
    fn abis_use_android_names() {
        assert_eq!(android_abi("x86_64"), "x86_64");
        assert_eq!(android_abi("armv7l"), "armeabi-v7a");
        assert_eq!(android_abi("i686"), "x86");
    }
}
