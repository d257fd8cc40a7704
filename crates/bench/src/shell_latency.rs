//! `shell-latency`: how long a one-off `shell true` takes, start to exit,
//! through each path to one oxadbd on loopback: Google's adb CLI through
//! Google's server and through `oxadb server`, and `oxadb` through `oxadb
//! server` and alone (no server answering: it connects itself). Runs are
//! interleaved (a slow spell hits every path) and the table gives medians
//! and the ratio to Google's server from the same run.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{ensure, Result};

use crate::{
    free_port, machine_description, median, run_checked, start_daemon, start_oxadb_server,
};

#[derive(clap::Args)]
pub(crate) struct ShellLatencyArgs {
    /// Runs of each path; medians are reported.
    #[arg(long, default_value_t = 50)]
    runs: usize,
    #[arg(long, default_value = "target/release/oxadbd")]
    oxadbd: PathBuf,
    #[arg(long, default_value = "target/release/oxadb")]
    oxadb: PathBuf,
    /// Google's adb (Debian's adb 29 by default).
    #[arg(long, default_value = "adb")]
    adb: PathBuf,
    /// A directory for logs and homes.
    #[arg(long, default_value = "/dev/shm")]
    workdir: PathBuf,
}

/// Makes a fresh command for one run of a path.
type CommandMaker<'a> = Box<dyn Fn() -> Command + 'a>;

/// Processes of one measurement, ended on drop.
struct Processes {
    children: Vec<std::process::Child>,
    adb: PathBuf,
    adb_home: PathBuf,
    adb_port: u16,
    dir: PathBuf,
}

impl Drop for Processes {
    fn drop(&mut self) {
        let _ = Command::new(&self.adb)
            .env("HOME", &self.adb_home)
            .args(["-P", &self.adb_port.to_string(), "kill-server"])
            .output();
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn shell_latency(args: ShellLatencyArgs) -> Result<()> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    let dir = args
        .workdir
        .join(format!("oxadb-bench-latency-{}", std::process::id()));
    let adb_home = dir.join("adb-home");
    let oxadb_home = dir.join("oxadb-home");
    std::fs::create_dir_all(&adb_home)?;
    std::fs::create_dir_all(oxadb_home.join(".android"))?;
    let mut processes = Processes {
        children: Vec::new(),
        adb: args.adb.clone(),
        adb_home: adb_home.clone(),
        adb_port: free_port()?,
        dir: dir.clone(),
    };
    let adb_version = run_checked(Command::new(&args.adb).arg("version"), "adb version")?;
    run_checked(
        Command::new(&args.oxadb)
            .arg("keygen")
            .arg(oxadb_home.join(".android").join("adbkey")),
        "oxadb keygen",
    )?;
    let device_port = free_port()?;
    let serial = format!("127.0.0.1:{device_port}");
    processes.children.push(start_daemon(
        &args.oxadbd,
        device_port,
        &[],
        &dir.join("oxadbd.log"),
    )?);
    let oxadb_port = free_port()?;
    processes.children.push(start_oxadb_server(
        &args.oxadb,
        &oxadb_home,
        oxadb_port,
        &dir,
    )?);
    // A port nothing listens on: `oxadb` finds no server there and connects
    // to the device itself.
    let no_server_port = free_port()?;

    let adb = |port: u16| {
        let mut command = Command::new(&args.adb);
        command
            .env("HOME", &adb_home)
            .env("ADB_USB", "0")
            .env("ADB_EMU", "0")
            .env("ADB_MDNS", "0")
            .args(["-P", &port.to_string(), "-s", &serial]);
        command
    };
    let oxadb = |port: u16| {
        let mut command = Command::new(&args.oxadb);
        command
            .env("HOME", &oxadb_home)
            .env("ANDROID_ADB_SERVER_PORT", port.to_string())
            .args(["-s", &serial]);
        command
    };
    for port in [processes.adb_port, oxadb_port] {
        let text = run_checked(
            Command::new(&args.adb)
                .env("HOME", &adb_home)
                .env("ADB_USB", "0")
                .env("ADB_EMU", "0")
                .env("ADB_MDNS", "0")
                .args(["-P", &port.to_string(), "connect", &serial]),
            "adb connect",
        )?;
        ensure!(text.contains("connected"), "adb connect: {text}");
        let state = run_checked(adb(port).arg("get-state"), "adb get-state")?;
        ensure!(state.trim() == "device", "adb get-state: {state}");
    }

    let google_port = processes.adb_port;
    let paths: Vec<(&str, CommandMaker)> = vec![
        (
            "adb 29 CLI, Google's adb 29 server",
            Box::new(|| adb(google_port)),
        ),
        ("adb 29 CLI, oxadb server", Box::new(|| adb(oxadb_port))),
        (
            "oxadb, through oxadb server",
            Box::new(|| oxadb(oxadb_port)),
        ),
        (
            "oxadb, no server (direct)",
            Box::new(|| oxadb(no_server_port)),
        ),
    ];
    let mut millis: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    for run in 0..args.runs {
        for step in 0..paths.len() {
            let which = (run + step) % paths.len();
            let (name, command) = &paths[which];
            let start = Instant::now();
            let output = command()
                .args(["shell", "true"])
                .stdin(Stdio::null())
                .output()?;
            let elapsed = start.elapsed();
            ensure!(
                output.status.success(),
                "{name}: shell true failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            millis[which].push(elapsed.as_secs_f64() * 1e3);
        }
    }

    println!("Machine: {}", machine_description());
    println!(
        "Client: {}",
        adb_version.lines().nth(1).unwrap_or("adb").trim()
    );
    println!(
        "`shell true` against oxadbd on loopback, {} runs per path, interleaved; wall time of the client process",
        args.runs
    );
    println!();
    println!("| path | median ms | p10 ms | p90 ms | vs Google's server |");
    println!("|---|---|---|---|---|");
    let reference = median(&mut millis[0].clone());
    for (which, (name, _)) in paths.iter().enumerate() {
        let mut values = millis[which].clone();
        let middle = median(&mut values);
        let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {name} | {middle:.1} | {:.1} | {:.1} | {:.2} |",
            at(0.1),
            at(0.9),
            middle / reference
        );
    }
    Ok(())
}
