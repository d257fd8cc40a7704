//! `oxadb push` and `oxadb pull`: adb's flags, progress and summary lines.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use oxadb::sync::{self, Compression, Direction, Progress, PullOptions, PushOptions};
use oxadb::Error;

use super::endpoint::Endpoint;
use oxadb_transfer::{Durability, Storage};

const COMPRESSION_HELP: &str = "Compress file data with ALGORITHM: any, none, brotli, lz4 or zstd \
    (any = the best the device supports: zstd, then lz4, then brotli). Used only when the device \
    advertises sendrecv_v2 and the algorithm; otherwise the data goes uncompressed. \
    Default: none, as with adb 29 (adb 35 defaults to any for push)";

/// Arguments of `oxadb push` (adb's `push [--sync] [-z ALGORITHM] [-Z] [-n] [-q] LOCAL... REMOTE`).
#[derive(Debug, Clone, clap::Args)]
pub struct PushArgs {
    /// Local files or directories to copy. Directories are copied recursively;
    /// symlinks inside them are recreated as symlinks, other special files are
    /// skipped. Files keep their mode and mtime.
    #[arg(value_name = "LOCAL", required = true)]
    pub sources: Vec<PathBuf>,
    /// Destination on the device. If it is an existing directory, each LOCAL
    /// is copied into it under its own name; otherwise a single LOCAL is
    /// copied to REMOTE itself. Several LOCALs need a directory.
    #[arg(value_name = "REMOTE")]
    pub destination: String,
    /// Only push files whose size or timestamp differ from the device's copy.
    #[arg(long)]
    pub sync: bool,
    #[arg(
        short = 'z',
        value_name = "ALGORITHM",
        value_parser = compression_parser(),
        overrides_with = "no_compression",
        help = COMPRESSION_HELP
    )]
    pub compression: Option<Compression>,
    /// Disable compression (the default).
    #[arg(short = 'Z', overrides_with = "compression")]
    pub no_compression: bool,
    /// Dry run: send the files, but the device only decodes and discards them
    /// and changes nothing. Needs a device with sendrecv_v2_dry_run_send.
    #[arg(short = 'n', long = "dry-run")]
    pub dry_run: bool,
    /// Suppress the progress bar and the summary lines.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// After the summary, print the sync stream's flow-control statistics:
    /// bytes and packets, time blocked on credit and on the consumer, window,
    /// round trip and rate.
    #[arg(long)]
    pub stats: bool,
    /// Send one file or block device image as block operations on the
    /// device's old copy of REMOTE (a regular file, or a block device written
    /// in place): unchanged and moved blocks cross as a few bytes, zeros as
    /// none, new data zstd-compressed. With -n, print the plan and change
    /// nothing. Needs oxadbd (feature oxadb_delta); otherwise the whole file
    /// is pushed. docs/delta.md.
    #[arg(long, conflicts_with_all = ["sync", "compression"])]
    pub delta: bool,
    /// With --delta: the image the device is believed to hold (the last
    /// one pushed). A block that changed a little is then sent as the
    /// compressed XOR with its old bytes, where the device's digests show
    /// BASE still describes them.
    #[arg(long, value_name = "BASE", requires = "delta")]
    pub base: Option<std::path::PathBuf>,
    /// Ignored (accepted by adb for compatibility).
    #[arg(short = 'p', hide = true)]
    pub compat_p: bool,
}

impl PushArgs {
    /// The compression `-z`/`-Z` ask for (none by default).
    pub fn compression(&self) -> Compression {
        match self.compression {
            Some(compression) if !self.no_compression => compression,
            _ => Compression::None,
        }
    }
}

/// Arguments of `oxadb pull` (adb's `pull [-a] [-z ALGORITHM] [-Z] [-q] REMOTE... [LOCAL]`).
///
/// As with adb, the last of several paths is the local destination, and a
/// single path is pulled into the current directory.
#[derive(Debug, Clone)]
pub struct PullArgs {
    /// Files or directories on the device.
    pub sources: Vec<String>,
    /// Where to put them (default `.`).
    pub destination: PathBuf,
    /// `-a`: preserve the files' mtime and mode.
    pub preserve: bool,
    pub compression: Option<Compression>,
    pub no_compression: bool,
    pub quiet: bool,
    pub stats: bool,
}

impl PullArgs {
    /// The compression `-z`/`-Z` ask for (none by default).
    pub fn compression(&self) -> Compression {
        match self.compression {
            Some(compression) if !self.no_compression => compression,
            _ => Compression::None,
        }
    }
}

/// What clap parses for `pull`; split into sources and destination after.
#[derive(Debug, Clone, clap::Args)]
#[command(override_usage = "oxadb pull [OPTIONS] REMOTE... [LOCAL]")]
struct PullArgsRaw {
    /// Files or directories on the device; when there are two paths or
    /// more, the last is LOCAL, where to put them (default: the current
    /// directory). If LOCAL is an existing
    /// directory, each REMOTE is copied into it under its own name;
    /// otherwise a single REMOTE is copied to LOCAL itself. Directories are
    /// copied recursively, following symlinks. An existing LOCAL file is
    /// replaced only once the whole file arrived; an existing device node or
    /// FIFO (e.g. /dev/null) is written to, never replaced.
    #[arg(value_name = "REMOTE", required = true, num_args = 1..)]
    paths: Vec<OsString>,
    /// Preserve the files' mtime and mode (the mode minus the umask, as adb).
    #[arg(short = 'a')]
    preserve: bool,
    #[arg(
        short = 'z',
        value_name = "ALGORITHM",
        value_parser = compression_parser(),
        overrides_with = "no_compression",
        help = COMPRESSION_HELP.replace(" (adb 35 defaults to any for push)", "")
    )]
    compression: Option<Compression>,
    /// Disable compression (the default).
    #[arg(short = 'Z', overrides_with = "compression")]
    no_compression: bool,
    /// Suppress the progress bar and the summary lines.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// After the summary, print the sync stream's flow-control statistics:
    /// bytes and packets, time blocked on credit and on the consumer, window,
    /// round trip and rate.
    #[arg(long)]
    stats: bool,
    /// Ignored (accepted by adb for compatibility).
    #[arg(short = 'p', hide = true)]
    compat_p: bool,
}

impl clap::FromArgMatches for PullArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let raw = PullArgsRaw::from_arg_matches(matches)?;
        let mut paths = raw.paths;
        let destination = if paths.len() > 1 {
            PathBuf::from(paths.pop().expect("two paths or more"))
        } else {
            PathBuf::from(".")
        };
        let sources = paths
            .into_iter()
            .map(|path| {
                path.into_string().map_err(|path| {
                    clap::Error::raw(
                        clap::error::ErrorKind::InvalidUtf8,
                        format!("remote path {path:?} is not valid UTF-8\n"),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PullArgs {
            sources,
            destination,
            preserve: raw.preserve,
            compression: raw.compression,
            no_compression: raw.no_compression,
            quiet: raw.quiet,
            stats: raw.stats,
        })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for PullArgs {
    fn augment_args(command: clap::Command) -> clap::Command {
        PullArgsRaw::augment_args(command)
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        PullArgsRaw::augment_args_for_update(command)
    }
}

fn compression_parser() -> impl clap::builder::TypedValueParser<Value = Compression> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Compression::NAMES)
        .map(|name| name.parse::<Compression>().expect("a listed name"))
}

/// `oxadb push`: prints adb's summary line per source (and a total for
/// several) on stdout, a progress bar on stderr when it is a terminal.
pub async fn push(device: &Endpoint, args: &PushArgs) -> anyhow::Result<()> {
    if args.delta && super::delta::offered(device) {
        return super::delta::push(device, args).await;
    }
    let options = PushOptions {
        sync: args.sync,
        compression: args.compression(),
        dry_run: args.dry_run,
        features: None,
    };
    let mut reporter = Reporter::new(Direction::Push, args.quiet, args.stats);
    let result = sync::push(
        device.sync(),
        &args.sources,
        &args.destination,
        &options,
        &mut reporter,
    )
    .await;
    reporter.conclude(device, result)
}

/// `oxadb pull`, its files flushed as `durability` says: output as for [`push`].
pub async fn pull(
    device: &Endpoint,
    args: &PullArgs,
    durability: Durability,
) -> anyhow::Result<()> {
    // Sweeps what killed pulls left, and records where this one writes.
    let journal = super::state::open_pull_journal();
    let options = PullOptions {
        preserve: args.preserve,
        compression: args.compression(),
        features: None,
        storage: Storage {
            durability,
            journal: journal.journal(),
        },
    };
    let mut reporter = Reporter::new(Direction::Pull, args.quiet, args.stats);
    let result = sync::pull(
        device.sync(),
        &args.sources,
        &args.destination,
        &options,
        &mut reporter,
    )
    .await;
    reporter.conclude(device, result)
}

/// Progress bar (stderr, terminals only), warnings and summary lines.
struct Reporter {
    direction: Direction,
    quiet: bool,
    /// `--stats`: print the stream statistics after the summary.
    stats: bool,
    interactive: bool,
    bar: Option<ProgressBar>,
    started: Instant,
    total: sync::TransferSummary,
    last_source: sync::TransferSummary,
}

impl Reporter {
    fn new(direction: Direction, quiet: bool, stats: bool) -> Reporter {
        let interactive = !quiet
            && std::io::stderr().is_terminal()
            && std::env::var_os("TERM").is_some_and(|term| term != "dumb");
        Reporter {
            direction,
            quiet,
            stats,
            interactive,
            bar: None,
            started: Instant::now(),
            total: sync::TransferSummary::default(),
            last_source: sync::TransferSummary::default(),
        }
    }

    /// Runs `print` with the progress bar out of the way.
    fn print(&self, print: impl FnOnce()) {
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }

    /// adb's total line (when it differs from the last source's), then the
    /// errors: all but the last printed here, the last returned.
    fn conclude(
        mut self,
        device: &Endpoint,
        result: oxadb::Result<sync::TransferSummary>,
    ) -> anyhow::Result<()> {
        // A device that went away fails every file after it: say that once.
        let result = match (result, device.lost()) {
            (Err(error), Some(lost)) => {
                tracing::debug!(%error, "transfer failed after the connection was lost");
                Err(lost)
            }
            (result, _) => result,
        };
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let total = match &result {
            Ok(total) => *total,
            Err(_) => sync::TransferSummary {
                elapsed: self.started.elapsed(),
                ..self.total
            },
        };
        if !self.quiet && !total.same_counts(&self.last_source) {
            println!("{}", total.report("", self.direction));
        }
        if self.stats {
            if let Ok(total) = &result {
                for line in total.stats_report() {
                    println!("{line}");
                }
            }
        }
        match result {
            Ok(_) => Ok(()),
            Err(Error::Transfer { mut messages }) => {
                let last = messages.pop().unwrap_or_default();
                for message in messages {
                    eprintln!("oxadb: error: {message}");
                }
                Err(anyhow::anyhow!(last))
            }
            Err(other) => Err(other.into()),
        }
    }
}

impl Progress for Reporter {
    fn start(&mut self, name: &str, total: Option<u64>) {
        if !self.interactive {
            return;
        }
        // Drawn only once styled: indicatif's default style is wider than
        // a narrow terminal.
        let bar = self.bar.get_or_insert_with(|| {
            ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
        });
        bar.reset();
        let (template, name, _) = bar_layout(terminal_width(), total.is_some(), name);
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> ").with_key("eta_known", write_eta));
        }
        match total {
            Some(total) => bar.set_length(total),
            None => bar.unset_length(),
        }
        bar.set_message(name);
        if bar.is_hidden() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        bar.enable_steady_tick(Duration::from_millis(200));
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }

    fn finish(&mut self) {}

    fn warning(&mut self, message: &str) {
        self.print(|| eprintln!("oxadb: warning: {message}"));
    }

    fn source_finished(&mut self, source: &str, summary: &sync::TransferSummary) {
        self.total.files_transferred += summary.files_transferred;
        self.total.files_skipped += summary.files_skipped;
        self.total.bytes += summary.bytes;
        self.last_source = *summary;
        if !self.quiet {
            let line = summary.report(source, self.direction);
            self.print(|| println!("{line}"));
        }
    }
}

/// The counters beside a sized bar and their columns at their widest:
/// `1023.99 KiB` for sizes (indicatif switches unit at 1024, not 1000),
/// `1023.99 KiB/s` for the rate, `ETA 2h03m`.
const COUNTERS: (&str, usize) = (
    "{bytes:>11}/{total_bytes:<11} {binary_bytes_per_sec:>13} {eta_known:9}",
    11 + 1 + 11 + 1 + 13 + 1 + 9,
);
/// Below 80 columns: the share done, the bytes and the ETA, so the file
/// name keeps some 30 columns even at 60.
const NARROW_COUNTERS: (&str, usize) = (
    "{percent:>3}% {bytes:>11} {eta_known:9}",
    3 + 1 + 1 + 11 + 1 + 9,
);
/// Below 50 columns: the share done and the ETA (or, without a size, the
/// bytes), so a name of a dozen characters still shows whole at 40.
const TINY_COUNTERS: (&str, usize) = ("{percent:>3}% {eta_known:9}", 3 + 1 + 1 + 9);
const TINY_SPINNER_COUNTERS: (&str, usize) = ("{spinner} {bytes:>11}", 1 + 1 + 11);
/// Without a size (a file that grows as it is read).
const SPINNER_COUNTERS: (&str, usize) = (
    "{spinner} {bytes:>11} {binary_bytes_per_sec:>13}",
    1 + 1 + 11 + 1 + 13,
);

/// stderr's width in columns (80 when it has none).
fn terminal_width() -> usize {
    rustix::termios::tcgetwinsize(std::io::stderr())
        .ok()
        .map(|size| usize::from(size.ws_col))
        .filter(|&cols| cols > 0)
        .unwrap_or(80)
}

/// The bar's template for a terminal `width` columns wide, the name to show
/// (cut from the left so the line never wraps: a wrapped line is redrawn
/// below itself, and the file name, its most useful part, is lost) and the
/// columns the line takes at most. The last column stays free: some
/// terminals wrap on writing it.
fn bar_layout(width: usize, sized: bool, name: &str) -> (String, String, usize) {
    let usable = width.saturating_sub(1);
    let (counters, counters_width) = match sized {
        false if usable >= 49 => SPINNER_COUNTERS,
        false => TINY_SPINNER_COUNTERS,
        true if usable >= 79 => COUNTERS,
        true if usable >= 49 => NARROW_COUNTERS,
        true => TINY_COUNTERS,
    };
    let mut room = usable.saturating_sub(counters_width + 1);
    // A bar only where the name keeps 30 columns beside it.
    let bar_width = if counters != COUNTERS.0 {
        0
    } else if room >= 25 + 3 + 30 {
        25
    } else if room >= 10 + 3 + 30 {
        room - 3 - 30
    } else {
        0
    };
    let template = if bar_width > 0 {
        room -= bar_width + 3;
        format!("[{{bar:{bar_width}}}] {counters} {{msg}}")
    } else {
        format!("{counters} {{msg}}")
    };
    let name = truncate_left(name, room);
    let used = usable - room + name.chars().count();
    (template, name, used)
}

/// `text` cut to its last `width` characters, with "…" where it was cut.
fn truncate_left(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let keep: String = text.chars().skip(count - (width - 1)).collect();
    format!("…{keep}")
}

/// `{eta_known}`: nothing until a rate is known (a second of data), then
/// the time left, e.g. `ETA 5s`, `ETA 3m05s`, `ETA 2h03m`.
fn write_eta(state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write) {
    if state.pos() == 0 || state.elapsed() < Duration::from_secs(1) || state.len().is_none() {
        return;
    }
    let seconds = state.eta().as_secs();
    let _ = match seconds {
        0..=59 => write!(out, "ETA {seconds}s"),
        60..=3599 => write!(out, "ETA {}m{:02}s", seconds / 60, seconds % 60),
        _ => write!(
            out,
            "ETA {}h{:02}m",
            (seconds / 3600).min(99),
            seconds / 60 % 60
        ),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_bar_fits_the_terminal_and_keeps_the_file_name() {
        let name = "/var/tmp/some/rather/long/directory/name/big-file.bin";
        for width in [40, 60, 80, 100, 120, 200] {
            for sized in [true, false] {
                let (template, shown, used) = bar_layout(width, sized, name);
                assert!(used < width, "{width}: {template} {shown}");
                assert!(shown.ends_with("big-file.bin"), "{width}: {shown}");
                assert_eq!(
                    template.contains("{bar:"),
                    sized && width >= 100,
                    "{template}"
                );
                assert_eq!(template.contains("ETA") || template.contains("eta"), sized);
            }
        }
        assert_eq!(bar_layout(200, true, name).1, name);
        assert!(bar_layout(60, true, name).1.starts_with('…'));
        assert_eq!(truncate_left("abcdef", 4), "…def");
    }

    #[test]
    fn the_counters_columns_hold_the_widest_values() {
        // Just under a unit change is the widest a size or rate gets.
        let widest_size = indicatif::HumanBytes(1024 * 1024 - 1).to_string();
        let widest_rate = format!("{}/s", indicatif::BinaryBytes(1024 * 1024 - 1));
        assert_eq!(widest_size, "1024.00 KiB");
        for (template, _) in [
            COUNTERS,
            NARROW_COUNTERS,
            SPINNER_COUNTERS,
            TINY_SPINNER_COUNTERS,
        ] {
            assert!(template.contains(&format!("{{bytes:>{}}}", widest_size.len())));
        }
        assert!(COUNTERS.0.contains(&format!(":>{}}}", widest_rate.len())));
        assert!(SPINNER_COUNTERS
            .0
            .contains(&format!(":>{}}}", widest_rate.len())));
    }

    #[derive(Debug, Parser)]
    enum Cli {
        Push(PushArgs),
        Pull(PullArgs),
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("oxadb").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn push_flags() {
        let Cli::Push(push) = parse(&["push", "--sync", "-z", "lz4", "a", "b", "/sdcard/"]) else {
            panic!()
        };
        assert_eq!(push.sources, [PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(push.destination, "/sdcard/");
        assert!(push.sync && !push.dry_run);
        assert_eq!(push.compression(), Compression::Lz4);

        let Cli::Push(push) = parse(&["push", "-z", "zstd", "-Z", "-n", "a", "/x"]) else {
            panic!()
        };
        assert_eq!(push.compression(), Compression::None);
        assert!(push.dry_run);
        let Cli::Push(push) = parse(&["push", "-Z", "-z", "any", "a", "/x"]) else {
            panic!()
        };
        assert_eq!(push.compression(), Compression::Any);
        let Cli::Push(push) = parse(&["push", "a", "/x"]) else {
            panic!()
        };
        assert_eq!(push.compression(), Compression::None);

        assert!(Cli::try_parse_from(["oxadb", "push", "only-one"]).is_err());
        assert!(Cli::try_parse_from(["oxadb", "push", "-z", "gzip", "a", "b"]).is_err());
    }

    #[test]
    fn pull_last_path_is_the_destination() {
        let Cli::Pull(pull) = parse(&["pull", "/sdcard/a"]) else {
            panic!()
        };
        assert_eq!(pull.sources, ["/sdcard/a"]);
        assert_eq!(pull.destination, PathBuf::from("."));
        let Cli::Pull(pull) = parse(&["pull", "-a", "-z", "brotli", "/r1", "/r2", "out"]) else {
            panic!()
        };
        assert_eq!(pull.sources, ["/r1", "/r2"]);
        assert_eq!(pull.destination, PathBuf::from("out"));
        assert!(pull.preserve);
        assert_eq!(pull.compression(), Compression::Brotli);
        assert!(Cli::try_parse_from(["oxadb", "pull"]).is_err());
    }

    #[test]
    fn help_mentions_defaults() {
        use clap::CommandFactory;
        let mut command = Cli::command();
        let help = command
            .find_subcommand_mut("push")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("Default: none, as with adb 29"), "{help}");
        assert!(help.contains("--sync"), "{help}");
        let help = command
            .find_subcommand_mut("pull")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("REMOTE... [LOCAL]"), "{help}");
        // One name per argument, adb's: no clap placeholder beside them.
        assert!(!help.contains("<PATH>"), "{help}");
        assert!(help.contains("-a"), "{help}");
    }
}
