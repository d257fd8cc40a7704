//! An authorized-keys file in adb's format (`adb_keys`): one `adbkey.pub`
//! line per key.

use std::path::Path;

use crate::{KeyError, PublicKey};

/// The public keys a daemon accepts, with their comments (`user@host`).
#[derive(Clone, Debug, Default)]
pub struct AuthorizedKeys {
    keys: Vec<(PublicKey, String)>,
}

impl AuthorizedKeys {
    /// Parses the file's text. Blank lines and lines starting with `#` are
    /// skipped; so are malformed lines, each logged with its line number.
    pub fn parse(text: &str) -> AuthorizedKeys {
        Self::parse_at(text, "authorized keys")
    }

    fn parse_at(text: &str, origin: &str) -> AuthorizedKeys {
        let mut keys = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let line = line.trim_matches(|c: char| c == '\0' || c.is_whitespace());
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match PublicKey::parse_adbkey_pub_at(line, &format!("{origin} line {line_number}")) {
                Ok(entry) => keys.push(entry),
                Err(error) => tracing::warn!(line = line_number, %error, "skipped malformed key"),
            }
        }
        AuthorizedKeys { keys }
    }

    /// Reads and parses an `adb_keys` file.
    pub fn load(path: &Path) -> Result<AuthorizedKeys, KeyError> {
        let bytes = std::fs::read(path).map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            action: "read the authorized keys",
            cause: source,
        })?;
        Ok(Self::parse_at(
            &String::from_utf8_lossy(&bytes),
            &path.display().to_string(),
        ))
    }

    /// The keys and their comments, in file order.
    pub fn keys(&self) -> &[(PublicKey, String)] {
        &self.keys
    }

    pub fn contains(&self, key: &PublicKey) -> bool {
        self.keys.iter().any(|(known, _)| known == key)
    }

    /// The first key whose signature of `token` `signature` is (what adbd
    /// does on AUTH SIGNATURE).
    pub fn verify(&self, token: &[u8], signature: &[u8]) -> Option<&(PublicKey, String)> {
        self.keys
            .iter()
            .find(|(key, _)| key.verify_token(token, signature))
    }
}
