//! A command line the daemon may serve itself (`logcat`, `getprop`,
//! `setprop`), read as words: the recognised invocation, the answer it
//! gets, and the shell quoting and PATH lookup the services around it
//! share. Only plain words are understood (quotes and backslashes
//! included): anything a shell would interpret (pipes, `;` lists beyond
//! adb's own `export ANDROID_LOG_TAGS=...;` prefix, redirections, `$`
//! expansions) makes the line an ordinary shell command.

use std::path::{Path, PathBuf};

/// A complete reply: what a program would have printed, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    pub stdout: String,
    pub stderr: String,
    pub status: u8,
}

impl Answer {
    pub fn out(stdout: impl Into<String>) -> Answer {
        Answer {
            stdout: stdout.into(),
            ..Answer::default()
        }
    }

    pub fn fail(stderr: impl Into<String>) -> Answer {
        Answer {
            stderr: stderr.into(),
            status: 1,
            ..Answer::default()
        }
    }
}

/// A recognised invocation: the program, its arguments and the
/// `ANDROID_LOG_TAGS` value adb's `logcat` prefix exported, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub program: String,
    pub args: Vec<String>,
    pub log_tags: Option<String>,
}

/// `[export ANDROID_LOG_TAGS=WORD ;] [exec] PROGRAM ARGS...`, the shape of
/// adb's `logcat` command (AOSP client/commandline.cpp `logcat()`) and of a
/// typed `adb shell getprop NAME`; `None` for anything else.
pub fn parse(command: &str) -> Option<Invocation> {
    let mut words = split_words(command)?;
    let mut log_tags = None;
    if words.first().map(String::as_str) == Some("export") {
        let value = words.get(1)?.strip_prefix("ANDROID_LOG_TAGS=")?.to_string();
        if words.get(2).map(String::as_str) != Some(";") {
            return None;
        }
        log_tags = Some(value);
        words.drain(..3);
    }
    if words.first().map(String::as_str) == Some("exec") {
        words.remove(0);
    }
    if words.iter().any(|word| word == ";") || words.is_empty() {
        return None;
    }
    let program = words.remove(0);
    Some(Invocation {
        program,
        args: words,
        log_tags,
    })
}

/// Splits on unquoted blanks, removing quotes and backslashes as sh does. An
/// unquoted `;` is a word of its own; other characters with a meaning to the
/// shell, and unterminated quotes, give `None`.
fn split_words(command: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            ';' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                words.push(";".to_string());
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            c @ ('"' | '\\' | '$' | '`') => word.push(c),
                            '\n' => {}
                            c => {
                                word.push('\\');
                                word.push(c);
                            }
                        },
                        '$' | '`' => return None,
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next()? {
                    '\n' => {}
                    c => word.push(c),
                }
            }
            '|' | '&' | '<' | '>' | '(' | ')' | '$' | '`' | '*' | '?' | '[' | '~' | '#'
                if !in_word || !matches!(c, '#' | '~') =>
            {
                // `*` and `?` are left to the shell too: a filter such as
                // `*:S` reaches us quoted, as adb quotes every argument.
                return None;
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

/// Where `name` is on `path`, if it is an executable file there.
pub fn find_program(name: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// Quotes `word` for sh: single quotes, each `'` written as `'\''`.
pub fn sh_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./,=:+@%".contains(c))
    {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adb_logcat_lines_are_recognised() {
        // adb 34 (escape_arg quotes every word) and adb 29 (which wraps the
        // quoted value in double quotes as well).
        let adb34 = parse("export ANDROID_LOG_TAGS=''; exec logcat '-d' '*:S' 'tag:V'").unwrap();
        assert_eq!(adb34.program, "logcat");
        assert_eq!(adb34.args, ["-d", "*:S", "tag:V"]);
        assert_eq!(adb34.log_tags.as_deref(), Some(""));
        let adb29 = parse("export ANDROID_LOG_TAGS=\"''\"; exec logcat '-d'").unwrap();
        assert_eq!(adb29.args, ["-d"]);
        assert_eq!(adb29.log_tags.as_deref(), Some("''"));
        let typed = parse("getprop ro.product.model").unwrap();
        assert_eq!(typed.program, "getprop");
        assert_eq!(typed.args, ["ro.product.model"]);
        assert_eq!(typed.log_tags, None);
        assert_eq!(
            parse("  setprop   a\\ b \"c d\"").unwrap().args,
            ["a b", "c d"]
        );
    }

    #[test]
    fn anything_shell_like_goes_to_the_shell() {
        for line in [
            "getprop | grep x",
            "getprop x; rm -rf /tmp/y",
            "getprop $HOME",
            "logcat > /tmp/f",
            "getprop 'unterminated",
            "logcat && echo",
            "getprop `id`",
            "getprop \"$(id)\"",
            "logcat *:S",
            "",
            "export ANDROID_LOG_TAGS=x",
            "export PATH=/x; exec logcat",
        ] {
            assert_eq!(parse(line), None, "{line}");
        }
    }

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(sh_quote("ro.product.model"), "ro.product.model");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("a b"), "'a b'");
    }
}
