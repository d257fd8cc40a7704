//! `logcat` on a device without one: its arguments become a command line
//! that reads the system log (the systemd journal, a syslog file or the
//! kernel log), run by the shell service like any command, so that the
//! host closing the stream hangs it up as any shell command.

use std::path::{Path, PathBuf};

use super::invocation::{find_program, sh_quote, Answer, Invocation};

/// Where the device's system log is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// systemd-journald runs: `journalctl`.
    Journal,
    /// A syslog daemon's file: `cat` / `tail -F`.
    File(PathBuf),
    /// The kernel's ring buffer: `dmesg`.
    Kernel,
    /// Nothing readable.
    Nothing,
}

impl Source {
    /// The journal when journald runs, else /var/log/syslog or
    /// /var/log/messages, else the kernel log.
    pub fn detect() -> Source {
        let path = std::env::var("PATH")
            .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".into());
        // journald's socket exists exactly while it runs (systemd-journald.socket).
        if Path::new("/run/systemd/journal/socket").exists()
            && find_program("journalctl", &path).is_some()
        {
            return Source::Journal;
        }
        for file in ["/var/log/syslog", "/var/log/messages"] {
            if std::fs::File::open(file).is_ok() {
                return Source::File(file.into());
            }
        }
        if find_program("dmesg", &path).is_some() {
            return Source::Kernel;
        }
        Source::Nothing
    }

    fn describe(&self) -> String {
        match self {
            Source::Journal => "the systemd journal".into(),
            Source::File(path) => path.display().to_string(),
            Source::Kernel => "the kernel log".into(),
            Source::Nothing => "nothing".into(),
        }
    }
}

/// Android log priorities, most verbose first (AOSP liblog `android_LogPriority`).
const PRIORITIES: &str = "VDIWEFS";

/// How much of the log to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Amount {
    /// Everything, then follow (logcat's default).
    Follow,
    /// Everything, then exit (`-d`).
    Dump,
    /// The last N lines, then exit (`-t N`).
    Last(u64),
    /// The last N lines, then follow (`-T N`).
    LastThenFollow(u64),
}

/// The command line serving `invocation` from `source`, or the answer
/// refusing it (with logcat's exit status 1, or 0 for `--help`).
pub fn plan(invocation: &Invocation, source: &Source) -> Result<String, Answer> {
    let refuse = |what: String| {
        Answer::fail(format!(
            "logcat: {what} (oxadbd serves logcat from {})\n",
            source.describe()
        ))
    };
    let mut amount = Amount::Follow;
    let mut default_priority = 'V';
    let mut filters: Vec<(String, char)> = Vec::new();
    let mut args = invocation.args.iter();
    while let Some(arg) = args.next() {
        // `-tN`, `--opt=V` and `--opt V` forms, as getopt_long takes them.
        let (name, inline) = match arg.strip_prefix("--") {
            Some(long) => match long.split_once('=') {
                Some((name, value)) => (format!("--{name}"), Some(value.to_string())),
                None => (arg.clone(), None),
            },
            None if arg.starts_with('-') && arg.len() > 2 => {
                (arg[..2].to_string(), Some(arg[2..].to_string()))
            }
            None => (arg.clone(), None),
        };
        let mut value = |what: &str| match inline.clone().or_else(|| args.next().cloned()) {
            Some(value) => Ok(value),
            None => Err(refuse(format!("option {name} needs {what}"))),
        };
        match name.as_str() {
            "-d" => amount = Amount::Dump,
            "-D" | "--dividers" => {}
            "-s" => default_priority = 'S',
            "-c" | "--clear" => {
                return Err(refuse(
                    "-c (clear) is not supported: the system log is not logcat's to clear".into(),
                ))
            }
            "-h" | "--help" => return Err(Answer::out(USAGE)),
            "-v" | "--format" => {
                let format = value("a format")?;
                if !FORMATS.contains(&format.as_str()) {
                    return Err(refuse(format!("unknown format '{format}'")));
                }
                // Accepted for compatibility: lines keep the source's own format.
            }
            "-b" | "--buffer" => {
                let buffers = value("a buffer name")?;
                if let Some(bad) = buffers
                    .split(',')
                    .find(|b| !["main", "system", "crash", "default", "all", "kernel"].contains(b))
                {
                    return Err(refuse(format!("buffer '{bad}' is not available")));
                }
            }
            "-t" | "-T" => {
                let count = value("a line count")?;
                let Ok(lines) = count.parse::<u64>() else {
                    return Err(refuse(format!(
                        "{name} '{count}': only a line count is supported, not a time"
                    )));
                };
                amount = if name == "-t" {
                    Amount::Last(lines)
                } else {
                    Amount::LastThenFollow(lines)
                };
            }
            _ if arg.starts_with('-') => {
                return Err(refuse(format!(
                    "option {arg} is not supported; supported: -d -t N -T N -s -v FORMAT \
                     -b BUFFER -D and TAG[:PRIORITY] filters"
                )))
            }
            _ => filters.push(filter(arg).map_err(refuse)?),
        }
    }
    if filters.is_empty() {
        // Android's logcat falls back to $ANDROID_LOG_TAGS. adb 29 wraps
        // the single-quoted value in double quotes, so its quotes arrive
        // as part of the value (`''` when the host has none).
        if let Some(tags) = &invocation.log_tags {
            for spec in tags
                .split_whitespace()
                .map(|s| s.trim_matches('\''))
                .filter(|s| !s.is_empty())
            {
                filters.push(filter(spec).map_err(refuse)?);
            }
        }
    }
    let mut tags = Vec::new();
    for (tag, priority) in filters {
        if tag == "*" {
            default_priority = priority;
        } else {
            tags.push((tag, priority));
        }
    }
    if !tags.is_empty() && (*source != Source::Journal || default_priority != 'S') {
        return Err(refuse(
            "tag filters need the systemd journal (tags are syslog identifiers) and a silent \
             default (-s or *:S)"
                .into(),
        ));
    }
    // The least severe priority anything is shown at; None: nothing is.
    let shown = tags
        .iter()
        .map(|(_, p)| *p)
        .chain((tags.is_empty()).then_some(default_priority))
        .filter(|&p| p != 'S')
        .min_by_key(|&p| PRIORITIES.find(p));
    let Some(priority) = shown else {
        // Everything is silenced: nothing to print, as Android's logcat.
        return Ok(match amount {
            Amount::Dump | Amount::Last(_) => "true".into(),
            Amount::Follow | Amount::LastThenFollow(_) => "exec sleep 2147483647".into(),
        });
    };
    let level = syslog_level(priority);
    Ok(match source {
        Source::Journal => {
            let mut line = "exec journalctl --no-pager -q -b -o short-precise".to_string();
            match amount {
                Amount::Follow => line.push_str(" -f --no-tail"),
                Amount::Dump => {}
                Amount::Last(n) => line.push_str(&format!(" -n {n}")),
                Amount::LastThenFollow(n) => line.push_str(&format!(" -f -n {n}")),
            }
            if level < 7 {
                line.push_str(&format!(" -p {level}"));
            }
            for (tag, _) in tags.iter().filter(|(_, p)| *p != 'S') {
                line.push_str(&format!(" -t {}", sh_quote(tag)));
            }
            line
        }
        Source::File(path) => {
            if level < 7 {
                return Err(refuse(format!(
                    "priority filter *:{priority} needs the systemd journal or the kernel log: \
                     a syslog file does not record priorities"
                )));
            }
            let file = sh_quote(&path.to_string_lossy());
            match amount {
                Amount::Follow => format!("exec tail -n +1 -F {file}"),
                Amount::Dump => format!("exec cat {file}"),
                Amount::Last(n) => format!("exec tail -n {n} {file}"),
                Amount::LastThenFollow(n) => format!("exec tail -n {n} -F {file}"),
            }
        }
        Source::Kernel => {
            let filter = if level < 7 {
                format!(" --level {}", DMESG_LEVELS[..=level as usize].join(","))
            } else {
                String::new()
            };
            match amount {
                Amount::Follow => format!("exec dmesg -w{filter}"),
                Amount::Dump => format!("exec dmesg{filter}"),
                Amount::Last(n) => format!("dmesg{filter} | tail -n {n}"),
                Amount::LastThenFollow(n) => {
                    format!("dmesg{filter} | tail -n {n}; exec dmesg -W{filter}")
                }
            }
        }
        Source::Nothing => {
            return Err(refuse(
                "no system log on this device: no systemd journal, no /var/log/syslog or \
                 /var/log/messages, no dmesg"
                    .into(),
            ))
        }
    })
}

/// `TAG[:PRIORITY]`; a bare tag means `TAG:V` (AOSP liblog logprint.cpp).
fn filter(spec: &str) -> Result<(String, char), String> {
    let (tag, priority) = match spec.rsplit_once(':') {
        Some((tag, p)) => {
            let mut chars = p.chars();
            match (chars.next().map(|c| c.to_ascii_uppercase()), chars.next()) {
                (Some('*'), None) => (tag, 'V'),
                (Some(c), None) if PRIORITIES.contains(c) => (tag, c),
                _ => return Err(format!("invalid filter expression '{spec}'")),
            }
        }
        None => (spec, 'V'),
    };
    if tag.is_empty() {
        return Err(format!("invalid filter expression '{spec}'"));
    }
    Ok((tag.to_string(), priority))
}

/// The syslog level (RFC 5424) of an Android priority: V and D are debug.
fn syslog_level(priority: char) -> u8 {
    match priority {
        'V' | 'D' => 7,
        'I' => 6,
        'W' => 4,
        'E' => 3,
        _ => 2,
    }
}

/// dmesg's level names by syslog level.
const DMESG_LEVELS: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
];

/// Android logcat's `-v` formats and modifiers.
const FORMATS: &[&str] = &[
    "brief",
    "long",
    "process",
    "raw",
    "tag",
    "thread",
    "threadtime",
    "time",
    "color",
    "descriptive",
    "epoch",
    "monotonic",
    "printable",
    "uid",
    "usec",
    "nsec",
    "UTC",
    "year",
    "zone",
];

const USAGE: &str = "\
Usage: logcat [options] [filterspecs]
oxadbd serves logcat from the device's system log (the systemd journal, a
syslog file or the kernel log), in that log's own line format.
  -d            dump the log and exit
  -t N          print the last N lines and exit
  -T N          print the last N lines, then follow
  -s            set the default filter to silent (*:S)
  -v FORMAT     accepted; lines keep the system log's format
  -b BUFFER     main, system, crash, default, all or kernel (all one log)
filterspecs: TAG[:PRIORITY] (journal only, with -s or *:S) and *:PRIORITY,
  PRIORITY one of V D I W E F S
";

#[cfg(test)]
mod tests {
    use super::*;

    fn logcat(args: &[&str]) -> Invocation {
        Invocation {
            program: "logcat".into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            log_tags: Some("''".into()),
        }
    }

    #[test]
    fn each_source_dumps_and_follows() {
        let kernel = Source::Kernel;
        assert_eq!(plan(&logcat(&["-d"]), &kernel).unwrap(), "exec dmesg");
        assert_eq!(plan(&logcat(&[]), &kernel).unwrap(), "exec dmesg -w");
        assert_eq!(
            plan(&logcat(&["-t", "5"]), &kernel).unwrap(),
            "dmesg | tail -n 5"
        );
        assert_eq!(
            plan(&logcat(&["*:W", "-d"]), &kernel).unwrap(),
            "exec dmesg --level emerg,alert,crit,err,warn"
        );
        let journal = Source::Journal;
        assert_eq!(
            plan(&logcat(&["-d", "-v", "threadtime"]), &journal).unwrap(),
            "exec journalctl --no-pager -q -b -o short-precise"
        );
        assert_eq!(
            plan(&logcat(&["-s", "sshd:E", "-d"]), &journal).unwrap(),
            "exec journalctl --no-pager -q -b -o short-precise -p 3 -t sshd"
        );
        assert_eq!(
            plan(&logcat(&["-T5", "-s", "my tag:I", "sshd"]), &journal).unwrap(),
            "exec journalctl --no-pager -q -b -o short-precise -f -n 5 -t 'my tag' -t sshd"
        );
        let file = Source::File("/var/log/syslog".into());
        assert_eq!(
            plan(&logcat(&[]), &file).unwrap(),
            "exec tail -n +1 -F /var/log/syslog"
        );
        assert_eq!(
            plan(&logcat(&["-s"]), &file).unwrap(),
            "exec sleep 2147483647"
        );
    }

    #[test]
    fn android_log_tags_apply_without_filters_on_the_command_line() {
        let mut adb29 = logcat(&["-d"]);
        adb29.log_tags = Some("'*:W'".into());
        assert_eq!(
            plan(&adb29, &Source::Kernel).unwrap(),
            "exec dmesg --level emerg,alert,crit,err,warn"
        );
        let mut adb34 = logcat(&["-d", "*:V"]);
        adb34.log_tags = Some("*:W".into());
        assert_eq!(plan(&adb34, &Source::Kernel).unwrap(), "exec dmesg");
    }

    #[test]
    fn what_cannot_be_done_is_refused_clearly() {
        let kernel = Source::Kernel;
        let clear = plan(&logcat(&["-c"]), &kernel).unwrap_err();
        assert_eq!(clear.status, 1);
        assert!(
            clear
                .stderr
                .starts_with("logcat: -c (clear) is not supported"),
            "{}",
            clear.stderr
        );
        assert!(clear.stderr.contains("the kernel log"), "{}", clear.stderr);
        for args in [
            &["-s", "tag:D"][..],
            &["-t", "01-01 00:00:00.000"],
            &["-v", "bogus"],
            &["-b", "radio"],
            &["-g"],
            &["tag:Q"],
            &["-v"],
        ] {
            let answer = plan(&logcat(args), &kernel).unwrap_err();
            assert_eq!(answer.status, 1, "{args:?}");
            assert!(answer.stderr.starts_with("logcat: "), "{}", answer.stderr);
        }
        assert_eq!(plan(&logcat(&["--help"]), &kernel).unwrap_err().status, 0);
        assert!(plan(&logcat(&["-d"]), &Source::Nothing).is_err());
    }
}
