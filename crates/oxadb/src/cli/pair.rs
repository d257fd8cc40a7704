//! `pair HOST:PORT [CODE]`: wireless-debugging pairing ([`oxadb::pair`]),
//! asking for the code on the terminal as adb does when it is not given.

use std::io::{BufRead as _, Write as _};

use anyhow::Context as _;

/// Pairs with the device at `address` and prints what adb prints.
pub async fn pair(address: &str, code: Option<&str>) -> anyhow::Result<i32> {
    let (host, port) =
        oxadb::pair::split_address(address).with_context(|| format!("pairing with {address}"))?;
    let code = match code {
        Some(code) => code.to_string(),
        None => {
            print!("Enter pairing code: ");
            std::io::stdout().flush()?;
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("reading the pairing code from stdin")?;
            line.trim().to_string()
        }
    };
    let guid = oxadb::pair::pair(host, port, &code)
        .await
        .with_context(|| format!("pairing with {address}"))?;
    println!("Successfully paired to {address} [guid={guid}]");
    Ok(0)
}
