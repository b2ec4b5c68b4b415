//! `qtts pull` and `--model org/name`: checkpoints fetched from the Hugging Face Hub into its
//! cache (`qtts::hub`), with a progress display.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use qtts::hub::{self, Event, RepoName, Settings};

/// Options of `qtts pull`.
#[derive(clap::Args, Debug)]
pub(crate) struct PullArgs {
    /// A Hugging Face repository, `org/name` or `org/name@revision` (a branch, tag or commit);
    /// without one, the published Qwen3-TTS-12Hz repositories are listed.
    repo: Option<String>,
    /// Only fetch the checkpoint; do not convert it for the engine (the first use converts it).
    #[arg(long)]
    no_convert: bool,
    /// Convert to f32 (what `--exact` runs) instead of q8_0.
    #[arg(long)]
    exact: bool,
}

/// `qtts pull`.
pub(crate) fn run(args: &PullArgs) -> anyhow::Result<()> {
    let Some(repo) = &args.repo else {
        println!("The published Qwen3-TTS-12Hz checkpoints (qtts pull <repository>):");
        for p in hub::PUBLISHED {
            println!("  {:<38} {:<13} {}", p.repo, p.size, p.what);
        }
        println!(
            "Files go to the Hugging Face cache (HF_HOME, else ~/.cache/huggingface), shared with \
             Python's huggingface_hub; HF_ENDPOINT names a mirror, HF_TOKEN a token."
        );
        return Ok(());
    };
    let name = RepoName::parse(repo).with_context(|| {
        format!("{repo:?} is not a repository name: expected org/name or org/name@revision")
    })?;
    let snapshot = fetch(&name)?;
    println!("{}", snapshot.dir.display());
    if !args.no_convert {
        let model = crate::pick_model(Some(&snapshot.dir), args.exact)?;
        eprintln!(
            "qtts: ready: qtts speak --model {name}{} \"Hello.\" ({})",
            if args.exact { " --exact" } else { "" },
            model.files.talker.display()
        );
    }
    Ok(())
}

/// `arg` as a local path when one exists there (or it names the built-in model); else, when it
/// has the shape `org/name[@revision]`, the checkpoint fetched from the Hub (or found in its
/// cache); else `arg` unchanged (the caller's error names it).
pub(crate) fn local_or_fetched(arg: &Path) -> anyhow::Result<PathBuf> {
    if arg.exists() || arg == Path::new(qtts::model::find::BUILTIN) {
        return Ok(arg.to_path_buf());
    }
    match arg.to_str().and_then(RepoName::parse) {
        Some(name) => Ok(fetch(&name)?.dir),
        None => Ok(arg.to_path_buf()),
    }
}

/// The checkpoint `name` from the Hub's cache, fetched when incomplete, with its progress shown.
fn fetch(name: &RepoName) -> anyhow::Result<hub::Snapshot> {
    let settings = Settings::from_env();
    if let Some(s) = hub::cached(name, &settings) {
        eprintln!("qtts: {name}: in the cache ({})", s.dir.display());
        return Ok(s);
    }
    eprintln!(
        "qtts: {name}: fetching from {} into {}",
        settings.endpoint,
        settings.cache.display()
    );
    let start = Instant::now();
    let mut display = Display::new();
    let snapshot = hub::fetch(name, &settings, &mut |e| display.event(e));
    display.finish();
    let snapshot =
        snapshot.with_context(|| format!("fetching {name} (no local path of that name either)"))?;
    eprintln!(
        "qtts: {name}: {:.2} GB fetched and verified in {:.0} s (commit {})",
        snapshot.transferred as f64 / 1e9,
        start.elapsed().as_secs_f64(),
        &snapshot.commit[..12]
    );
    Ok(snapshot)
}

fn gb(bytes: u64) -> String {
    if bytes >= 100_000_000 {
        format!("{:.2} GB", bytes as f64 / 1e9)
    } else if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} kB", bytes as f64 / 1e3)
    }
}

/// Bars on a terminal (the current file and the total), lines elsewhere.
struct Display {
    bars: Option<(indicatif::MultiProgress, indicatif::ProgressBar)>,
    file: Option<indicatif::ProgressBar>,
}

impl Display {
    fn new() -> Self {
        let bars = std::io::stderr().is_terminal().then(|| {
            let multi = indicatif::MultiProgress::new();
            let total = multi.add(indicatif::ProgressBar::new(0));
            total.set_style(style(
                "total {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            ));
            (multi, total)
        });
        Display { bars, file: None }
    }

    fn event(&mut self, e: Event) {
        match (&self.bars, e) {
            (
                Some((_, total)),
                Event::Plan {
                    total: t, resumed, ..
                },
            ) => {
                total.set_length(t);
                total.set_position(resumed);
            }
            (
                None,
                Event::Plan {
                    files,
                    total,
                    resumed,
                },
            ) => eprintln!(
                "qtts: {files} files, {} to fetch{}",
                gb(total),
                if resumed > 0 {
                    format!(" ({} already here from an interrupted run)", gb(resumed))
                } else {
                    String::new()
                }
            ),
            (Some((multi, _)), Event::Start { file, size, from }) => {
                let bar = multi.insert(0, indicatif::ProgressBar::new(size));
                bar.set_style(style("{msg:38} {bar:30} {bytes}/{total_bytes}"));
                bar.set_message(file.to_owned());
                bar.set_position(from);
                self.file = Some(bar);
            }
            (None, Event::Start { file, size, from }) => {
                if from > 0 {
                    eprintln!("qtts: {file}: {}, resuming at {}", gb(size), gb(from));
                } else {
                    eprintln!("qtts: {file}: {}", gb(size));
                }
            }
            (Some((_, total)), Event::Bytes { n, .. }) => {
                total.inc(n);
                if let Some(b) = &self.file {
                    b.inc(n);
                }
            }
            (None, Event::Bytes { .. }) => {}
            (_, Event::Retry { file, at }) => self.line(&format!(
                "qtts: {file}: the connection dropped at {}; resuming",
                gb(at)
            )),
            (_, Event::Waiting { file }) => self.line(&format!(
                "qtts: {file}: another process is fetching it; waiting for it"
            )),
            (Some(_), Event::Done { .. }) => {
                if let Some(b) = self.file.take() {
                    b.finish_and_clear();
                }
            }
            (None, Event::Done { file }) => eprintln!("qtts: {file}: verified"),
        }
    }

    fn line(&self, text: &str) {
        match &self.bars {
            Some((multi, _)) => {
                let _ = multi.println(text);
            }
            None => eprintln!("{text}"),
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.file.take() {
            b.abandon();
        }
        if let Some((_, total)) = &self.bars {
            total.finish_and_clear();
        }
    }
}

fn style(template: &str) -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(template)
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
}
