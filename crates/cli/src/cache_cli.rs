//! `qtts cache`: the conversions of official checkpoints kept in the cache, listed or cleared.

use clap::Subcommand;

/// `qtts cache` actions.
#[derive(Subcommand, Debug)]
pub(crate) enum CacheAction {
    /// Each conversion: its directory, the checkpoint it came from, its type and size.
    List,
    /// Remove every conversion (they are made again on next use).
    Clear,
}

/// `qtts cache`.
pub(crate) fn run(action: &CacheAction) -> anyhow::Result<()> {
    use qtts::model::{cache, find};
    let dir = find::cache_dir();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    match action {
        CacheAction::List => {
            let entries = cache::list(&dir);
            if entries.is_empty() {
                println!("no conversions in {}", cache::converted_dir(&dir).display());
            }
            let mut total = 0;
            for e in &entries {
                total += e.bytes;
                let source = e
                    .source
                    .as_ref()
                    .map_or("(source unknown)".into(), |p| p.display().to_string());
                println!(
                    "{:>9.1} MiB  {:<5}  {}  from {source}",
                    mib(e.bytes),
                    e.ty.as_deref().unwrap_or("?"),
                    e.dir.display()
                );
            }
            if !entries.is_empty() {
                println!("{:>9.1} MiB in {} conversions", mib(total), entries.len());
            }
        }
        CacheAction::Clear => {
            let (removed, bytes) = cache::clear(&dir)?;
            for p in &removed {
                println!("removed {}", p.display());
            }
            println!("{:.1} MiB freed", mib(bytes));
        }
    }
    Ok(())
}
