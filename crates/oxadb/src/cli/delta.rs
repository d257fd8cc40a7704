//! `oxadb push --delta`: one image sent as block operations on the device's
//! old copy (docs/delta.md), or pushed whole where the device cannot.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use oxadb::delta::{push_delta, DeltaOptions, DeltaProgress, DeltaSummary, Phase, SERVICE};
use oxadb_delta::wire::Target;
use oxadb_wire::feature;

use super::endpoint::Endpoint;
use super::transfer::PushArgs;

/// Whether the device serves deltas; when not, says so on stderr (the
/// caller then pushes the whole file).
pub fn offered(device: &Endpoint) -> bool {
    let offered = device.features().iter().any(|f| f == feature::OXADB_DELTA);
    if !offered {
        eprintln!(
            "oxadb: {} does not offer {} (not oxadbd, an older one, or a server that did not \
             negotiate it): pushing the whole file",
            device.serial(),
            feature::OXADB_DELTA
        );
    }
    offered
}

pub async fn push(device: &Endpoint, args: &PushArgs) -> anyhow::Result<()> {
    let [source] = args.sources.as_slice() else {
        anyhow::bail!("--delta takes one LOCAL file or block device");
    };
    // A directory destination takes the file under its own name, as push does.
    let destination = if args.destination.ends_with('/') {
        let name = source
            .file_name()
            .ok_or_else(|| anyhow::anyhow!("{}: no file name", source.display()))?;
        format!("{}{}", args.destination, name.to_string_lossy())
    } else {
        args.destination.clone()
    };
    let interactive = !args.quiet
        && std::io::stderr().is_terminal()
        && std::env::var_os("TERM").is_some_and(|term| term != "dumb");
    let progress = interactive.then(DeltaProgress::new);
    let options = DeltaOptions {
        dry_run: args.dry_run,
        base: args.base.clone(),
        progress: progress.clone(),
        ..DeltaOptions::default()
    };
    let stream = device.open_text(SERVICE).await?;
    let bar = progress.map(|progress| tokio::spawn(draw(progress, source.display().to_string())));
    let result = push_delta(stream, source, &destination, &options).await;
    if let Some(bar) = bar {
        bar.abort();
        let _ = bar.await;
    }
    let summary = result.with_context(|| {
        format!(
            "{}: delta push of {} onto {destination}",
            device.serial(),
            source.display()
        )
    })?;
    if !args.quiet {
        print_summary(&source.display().to_string(), &destination, &summary);
    }
    Ok(())
}

fn print_summary(source: &str, destination: &str, summary: &DeltaSummary) {
    let counts = &summary.counts;
    let image = summary.image_len.max(1) as f64;
    if !summary.installed {
        let target = match summary.target {
            Target::Absent => "nothing there yet".to_string(),
            Target::File => format!("a file of {} bytes", summary.old_len),
            Target::BlockDevice => format!("a block device of {} bytes", summary.old_len),
        };
        println!("{source} -> {destination} ({target}), dry run:");
        println!("  unchanged {:>10} blocks", counts.same_blocks);
        println!("  copied    {:>10} blocks", counts.copy_blocks);
        println!("  zero      {:>10} blocks", counts.zero_blocks);
        println!(
            "  new data  {:>10} blocks, {} bytes",
            counts.replace_blocks, counts.replace_bytes
        );
        if summary.xor_blocks > 0 {
            println!(
                "  of which  {:>10} blocks as XOR with the base",
                summary.xor_blocks
            );
        }
        println!(
            "  to send   {} bytes ({:.1}% of {} bytes)",
            summary.bytes_sent,
            summary.bytes_sent as f64 * 100.0 / image,
            summary.image_len
        );
        return;
    }
    let seconds = summary.elapsed.as_secs_f64();
    let early = if summary.early_blocks > 0 {
        format!(
            "; {} blocks sent while the device still read its old image",
            summary.early_blocks
        )
    } else {
        String::new()
    };
    println!(
        "{source}: 1 file pushed as a delta. {} of {} bytes sent ({:.1}%), {} received, in {:.3}s \
         ({:.1} MB/s of image){early}",
        summary.bytes_sent,
        summary.image_len,
        summary.bytes_sent as f64 * 100.0 / image,
        summary.bytes_received,
        seconds,
        summary.image_len as f64 / seconds.max(1e-9) / 1e6
    );
}

/// Draws the delta's phases on stderr until aborted: the host reading its
/// image, the rest of the device's index, the data sent, the device's check.
async fn draw(progress: Arc<DeltaProgress>, name: String) {
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix}: {msg:16} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(name);
    // Cleared when the task is aborted (the bar's drop finishes it).
    let bar = Cleared(bar);
    let mut phase = None;
    loop {
        let (now, done, total) = progress.get();
        if phase != Some(now) {
            phase = Some(now);
            bar.0.reset();
            bar.0.set_message(match now {
                Phase::Reading => "reading",
                Phase::Index => "device index",
                Phase::Sending => "sending",
                Phase::Checking => "device checking",
            });
        }
        bar.0.set_length(total);
        bar.0.set_position(done.min(total));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A bar that clears itself when dropped.
struct Cleared(ProgressBar);

impl Drop for Cleared {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
