//! `delta`: updating an ext4 image on a device with `oxadb push --delta`,
//! beside pushing it whole with zstd, against oxadbd on loopback. The
//! program builds two versions of an image with `mkfs.ext4 -d` (the second
//! with files rewritten until about `--changed` percent of the image's
//! blocks differ), then, interleaved, times: the delta onto a target that
//! has no index (the device reads the old image), the delta onto one whose
//! index is kept (the update back and forth), and a whole `push -z zstd`.
//! Bytes on the wire are what the stream carried both ways; the reference
//! is the changed blocks compressed with zstd at the same level.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use rand::{Rng, RngCore, SeedableRng};

use crate::{cpu_seconds, machine_description, median, parse_size, start_daemon};

#[derive(clap::Args)]
pub(crate) struct DeltaArgs {
    /// Image size (suffixes K, M, G are powers of 1024).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Percent of the image's blocks the second version changes (about).
    #[arg(long, default_value_t = 5.0)]
    changed: f64,
    /// Runs of each transfer; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value = "target/release/oxadbd")]
    oxadbd: PathBuf,
    #[arg(long, default_value = "target/release/oxadb")]
    oxadb: PathBuf,
    /// A tmpfs directory for the images and the device's copies.
    #[arg(long, default_value = "/dev/shm")]
    workdir: PathBuf,
}

const BLOCK: usize = 4096;
// Pinned so both versions share them, as a reproducible build does.
const UUID: &str = "4a5b6c7d-1111-4222-8333-944455566677";

/// Removes the work directory on the way out, however the run ends.
struct Workdir(PathBuf);

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn delta(args: DeltaArgs) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    ensure!(
        args.changed > 0.0 && args.changed < 50.0,
        "--changed is a percentage above 0 and below 50"
    );
    let dir = Workdir(
        args.workdir
            .join(format!("oxadb-bench-delta-{}", std::process::id())),
    );
    std::fs::create_dir_all(dir.0.join("home"))?;
    std::fs::create_dir_all(dir.0.join("device"))?;
    let (v1, v2) = (dir.0.join("v1.img"), dir.0.join("v2.img"));
    eprintln!("building two ext4 images of {} MiB", args.size >> 20);
    build_images(&dir.0, &v1, &v2, args.size, args.changed)?;
    let (changed_blocks, changed_zstd) = changed_blocks(&v1, &v2)?;
    let blocks = args.size as usize / BLOCK;

    let port = crate::free_port()?;
    let mut daemon = start_daemon(
        &args.oxadbd,
        port,
        &[
            "--state-dir".to_string(),
            dir.0.join("state").display().to_string(),
        ],
        &dir.0.join("oxadbd.log"),
    )?;
    let serial = format!("127.0.0.1:{port}");
    let target = dir.0.join("device/rootfs.img");
    let whole = dir.0.join("device/whole.img");
    let names = [
        "push --delta, no index",
        "push --delta, index kept",
        "push -z zstd (whole image)",
    ];
    let mut seconds: [Vec<f64>; 3] = Default::default();
    let mut wire: [Vec<u64>; 3] = Default::default();
    let mut device_cpu: [Vec<f64>; 3] = Default::default();
    let oxadb = |extra: &[&str], source: &Path, dest: &Path| -> Result<(f64, u64, f64)> {
        let before = cpu_seconds(daemon.id())?;
        let started = Instant::now();
        let output = Command::new(&args.oxadb)
            .env("HOME", dir.0.join("home"))
            .args(["-s", &serial, "push"])
            .args(extra)
            .arg(source)
            .arg(dest)
            .output()
            .context("running oxadb")?;
        let elapsed = started.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        ensure!(
            output.status.success(),
            "oxadb push {extra:?} failed: {text}"
        );
        Ok((
            elapsed,
            bytes_on_wire(&text)?,
            cpu_seconds(daemon.id())? - before,
        ))
    };
    for run in 0..args.runs {
        for step in 0..3 {
            let which = (run + step) % 3;
            let measured = match which {
                0 => {
                    // A fresh copy: its inode and ctime are new, no index fits.
                    std::fs::copy(&v1, &target)?;
                    let measured = oxadb(&["--delta"], &v2, &target)?;
                    ensure!(same(&target, &v2)?, "the delta built another image");
                    measured
                }
                1 => {
                    // The target as the last delta left it: its index holds.
                    std::fs::copy(&v1, &target)?;
                    oxadb(&["--delta"], &v2, &target)?;
                    let measured = oxadb(&["--delta"], &v1, &target)?;
                    ensure!(same(&target, &v1)?, "the delta built another image");
                    measured
                }
                _ => {
                    let _ = std::fs::remove_file(&whole);
                    let measured = oxadb(&["-z", "zstd", "--stats"], &v2, &whole)?;
                    ensure!(same(&whole, &v2)?, "the push wrote another image");
                    measured
                }
            };
            eprintln!(
                "run {} {:>28}: {:.3} s, {} bytes on the wire",
                run + 1,
                names[which],
                measured.0,
                measured.1
            );
            seconds[which].push(measured.0);
            wire[which].push(measured.1);
            device_cpu[which].push(measured.2);
        }
    }
    if daemon.try_wait()?.is_some() {
        bail!("oxadbd exited during the benchmark");
    }
    let _ = daemon.kill();
    let _ = daemon.wait();

    println!("Machine: {}", machine_description());
    println!(
        "Image: ext4, {} MiB ({blocks} blocks of 4 KiB); {changed_blocks} blocks changed ({:.1}%), \
         {changed_zstd} bytes as zstd level 3; {} runs, interleaved; oxadbd on loopback",
        args.size >> 20,
        changed_blocks as f64 * 100.0 / blocks as f64,
        args.runs
    );
    println!();
    println!("| transfer | runs (s) | median s | bytes on the wire | vs changed blocks, zstd | device CPU s |");
    println!("|---|---|---|---|---|---|");
    for which in 0..3 {
        let runs: Vec<String> = seconds[which].iter().map(|s| format!("{s:.3}")).collect();
        let bytes = median(&mut wire[which].iter().map(|&b| b as f64).collect::<Vec<_>>());
        println!(
            "| {} | {} | {:.3} | {:.0} | {:.2} | {:.2} |",
            names[which],
            runs.join(", "),
            median(&mut seconds[which].clone()),
            bytes,
            bytes / changed_zstd.max(1) as f64,
            median(&mut device_cpu[which].clone())
        );
    }
    let time = |which: usize| median(&mut seconds[which].clone());
    println!();
    println!(
        "whole zstd push / delta without index: {:.2}; delta without index / with index: {:.2}",
        time(2) / time(0),
        time(0) / time(1)
    );
    Ok(())
}

/// Bytes both ways, from `push --delta`'s summary or `push --stats`.
fn bytes_on_wire(text: &str) -> Result<u64> {
    let number_before = |marker: &str| -> Option<u64> {
        let end = text.find(marker)?;
        text[..end].rsplit(' ').next()?.parse().ok()
    };
    let number_after = |marker: &str| -> Option<u64> {
        let start = text.find(marker)? + marker.len();
        text[start..].split(' ').next()?.parse().ok()
    };
    if let (Some(sent), Some(received)) = (
        number_before(" of "),
        text.find("bytes sent (")
            .and_then(|_| number_before(" received, in ")),
    ) {
        return Ok(sent + received);
    }
    match (number_after("  sent "), number_after("received ")) {
        (Some(sent), Some(received)) => Ok(sent + received),
        _ => bail!("no byte counts in oxadb's output: {text}"),
    }
}

fn same(a: &Path, b: &Path) -> Result<bool> {
    Ok(std::fs::read(a)? == std::fs::read(b)?)
}

/// A tree of random files filling about 40% of an image of `size`, the
/// first image built from it, then files rewritten (same sizes, new bytes)
/// until about `changed` percent of the image is, and the second image.
fn build_images(dir: &Path, v1: &Path, v2: &Path, size: u64, changed: f64) -> Result<()> {
    let tree = dir.join("tree");
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut files = Vec::new();
    let mut filled = 0u64;
    while filled < size * 2 / 5 {
        let len = rng.random_range(16..4096) as u64 * 1024;
        let path = tree
            .join(format!("d{}", files.len() % 16))
            .join(format!("f{}", files.len()));
        std::fs::create_dir_all(path.parent().expect("a parent"))?;
        write_random(&path, len, &mut rng)?;
        files.push((path, len));
        filled += len;
    }
    mkfs(&tree, v1, size)?;
    let mut rewritten = 0u64;
    let goal = (size as f64 * changed / 100.0) as u64;
    while rewritten < goal {
        let (path, len) = &files[rng.random_range(0..files.len())];
        write_random(path, *len, &mut rng)?;
        rewritten += len;
    }
    mkfs(&tree, v2, size)?;
    std::fs::remove_dir_all(&tree)?;
    Ok(())
}

fn write_random(path: &Path, len: u64, rng: &mut impl RngCore) -> Result<()> {
    let mut data = vec![0u8; len as usize];
    rng.fill_bytes(&mut data);
    std::fs::write(path, data)?;
    Ok(())
}

fn mkfs(tree: &Path, image: &Path, size: u64) -> Result<()> {
    let output = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-U", UUID, "-E"])
        .arg(format!("hash_seed={UUID}"))
        .arg("-d")
        .arg(tree)
        .arg(image)
        .arg(format!("{}k", size / 1024))
        .env("E2FSPROGS_FAKE_TIME", "1700000000")
        .output()
        .context("running mkfs.ext4 (Debian's e2fsprogs)")?;
    ensure!(
        output.status.success(),
        "mkfs.ext4 failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// How many blocks differ, and their new bytes compressed with zstd at
/// level 3 in 1 MiB pieces, as `push --delta` sends them.
fn changed_blocks(v1: &Path, v2: &Path) -> Result<(usize, usize)> {
    let (old, new) = (std::fs::read(v1)?, std::fs::read(v2)?);
    let mut changed = Vec::new();
    let mut count = 0;
    for (i, block) in new.chunks(BLOCK).enumerate() {
        if old.get(i * BLOCK..(i + 1) * BLOCK) != Some(block) {
            changed.extend_from_slice(block);
            count += 1;
        }
    }
    let compressed: usize = changed
        .chunks(1 << 20)
        .map(|piece| zstd::bulk::compress(piece, 3).map(|c| c.len().min(piece.len())))
        .sum::<std::io::Result<usize>>()?;
    Ok((count, compressed))
}
