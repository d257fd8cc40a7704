//! Binding a configfs gadget to a USB device controller (UDC).
//!
//! The gadget (made with configfs, e.g. by `scripts/usb-gadget.sh setup`)
//! can only be bound once the FunctionFS descriptors are written, so the
//! daemon can do it itself right after (`oxadbd --usb-gadget DIR`). Closing
//! ep0 (the daemon exiting) unbinds it again.

use std::path::Path;

use crate::FfsError;

/// Where the kernel lists the UDCs.
pub const UDC_CLASS_DIR: &str = "/sys/class/udc";

/// The UDCs listed in `class_dir`, sorted by name.
pub fn list_udcs(class_dir: &Path) -> Result<Vec<String>, FfsError> {
    let entries =
        std::fs::read_dir(class_dir).map_err(|e| FfsError::io(class_dir, "listing UDCs", e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| FfsError::io(class_dir, "listing UDCs", e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Binds the gadget at `gadget_dir` to `udc`, or to the first UDC of
/// `class_dir`; returns the UDC's name. A gadget already bound is left as
/// it is.
pub fn bind_udc(
    gadget_dir: &Path,
    udc: Option<&str>,
    class_dir: &Path,
) -> Result<String, FfsError> {
    let file = gadget_dir.join("UDC");
    let current = std::fs::read_to_string(&file)
        .map_err(|e| FfsError::io(&file, "reading the bound UDC", e))?;
    let current = current.trim();
    if !current.is_empty() {
        tracing::info!(gadget = %gadget_dir.display(), udc = current, "gadget already bound");
        return Ok(current.to_string());
    }
    let name = match udc {
        Some(name) => name.to_string(),
        None => list_udcs(class_dir)?
            .into_iter()
            .next()
            .ok_or_else(|| FfsError::NoUdc {
                path: class_dir.to_path_buf(),
            })?,
    };
    std::fs::write(&file, format!("{name}\n"))
        .map_err(|e| FfsError::io(&file, "binding the gadget", e))?;
    tracing::info!(gadget = %gadget_dir.display(), udc = %name, "gadget bound");
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_the_first_udc_once() {
        let root = tempfile::tempdir().unwrap();
        let class = root.path().join("udc");
        let gadget = root.path().join("gadget");
        std::fs::create_dir_all(class.join("dummy_udc.1")).unwrap();
        std::fs::create_dir_all(class.join("dummy_udc.0")).unwrap();
        std::fs::create_dir_all(&gadget).unwrap();
        std::fs::write(gadget.join("UDC"), "\n").unwrap();
        assert_eq!(bind_udc(&gadget, None, &class).unwrap(), "dummy_udc.0");
        assert_eq!(
            std::fs::read_to_string(gadget.join("UDC")).unwrap(),
            "dummy_udc.0\n"
        );
        // Bound already: left alone, even when another UDC is named.
        assert_eq!(
            bind_udc(&gadget, Some("other"), &class).unwrap(),
            "dummy_udc.0"
        );
        std::fs::write(gadget.join("UDC"), "").unwrap();
        assert_eq!(
            bind_udc(&gadget, Some("musb-hdrc.0"), &class).unwrap(),
            "musb-hdrc.0"
        );
        let empty = root.path().join("none");
        std::fs::create_dir_all(&empty).unwrap();
        std::fs::write(gadget.join("UDC"), "").unwrap();
        let error = bind_udc(&gadget, None, &empty).unwrap_err().to_string();
        assert!(error.contains("no UDC"), "{error}");
        let error = bind_udc(&root.path().join("missing"), None, &class)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("missing/UDC: reading the bound UDC"),
            "{error}"
        );
    }
}
