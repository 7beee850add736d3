//! The jobs layer from library code, as a front end other than the CLI
//! would use it: a typed config, the sinks the caller chose, an outcome.
//! The run reports to exactly the sinks it was given, its stages follow the
//! catalogue in the reference scripts' order, a refused config names the
//! setting (not a flag), and the in-process prune equals the binary's.

mod support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prunemem::data::LineRange;
use prunemem::events::{Event, EventSink, SinkError, stages};
use prunemem::jobs::{self, Field, JobError, PruneJob, RunOptions, TextSource};
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::profiler::ProfilerConfig;
use prunemem::prune::Method;
use support::{json_line, run_prunemem, s};

struct Recorder(Arc<Mutex<Vec<Event>>>);

impl EventSink for Recorder {
    fn on_event(&mut self, e: &Event) -> Result<(), SinkError> {
        self.0.lock().unwrap().push(e.clone());
        Ok(())
    }
    fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

fn options(seen: &Arc<Mutex<Vec<Event>>>) -> RunOptions {
    RunOptions {
        log_dir: None,
        sinks: vec![Box::new(Recorder(seen.clone()))],
        profiler: ProfilerConfig {
            sampler_hz: None,
            gpu_index: None,
            ..Default::default()
        },
        handle_signals: false,
        ..Default::default()
    }
}

/// A synthetic model and a text, in a folder removed on drop.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf, TextSource) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_checkpoint(&model, &SyntheticSpec::default()).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(6000)).unwrap();
    let src = TextSource {
        path: text.clone(),
        lines: LineRange::All,
    };
    (dir, model, text, src)
}

fn stage_labels(events: &[Event]) -> Vec<String> {
    let mut labels = support::stage_labels(events);
    labels.retain(|l| !stages::is_layer(l));
    labels
}

/// Where the time went is counted process-wide (`prunemem::timing`): the
/// jobs of this file run one at a time, so one's seconds are not another's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn a_prune_job_reports_to_the_sinks_it_is_given() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (_dir, model, text, src) = fixture();
    let mut job = PruneJob::new(s(&model), Method::Wanda);
    (job.nsamples, job.seqlen) = (8, Some(64));
    job.calib = Some(src.clone());
    job.eval = Some(src);
    job.eval_windows = Some(2);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let outcome = jobs::prune::run(&job, options(&seen)).unwrap();
    let events = seen.lock().unwrap().clone();
    assert!(matches!(events.first(), Some(Event::RunStarted { .. })));
    assert!(matches!(events.last(), Some(Event::RunFinished { .. })));
    assert_eq!(
        stage_labels(&events),
        [
            stages::START,
            stages::MODEL_LOADED,
            stages::BEFORE_PRUNING,
            stages::AFTER_PRUNING,
            stages::BEFORE_EVAL,
            stages::AFTER_EVAL,
            stages::END
        ]
    );
    assert!((outcome.prune.sparsity() - 0.5).abs() < 1e-9);
    assert!(outcome.saved.is_none() && outcome.logs.is_none());
    // The evaluation's head has its own progress after the layers' (run
    // inside the prune, so the last layer's is the prune's).
    let names: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcome.summary.results["pruned_layers_kept"], "inline",
        "a CPU run evaluates inside the prune"
    );
    assert!(!names.iter().any(|n| n.starts_with("eval model.layers")));
    let last_layer = names.iter().rposition(|n| n.starts_with("model.layers"));
    let logits = names
        .iter()
        .position(|n| n.starts_with("eval logits batch"));
    assert!(
        matches!((last_layer, logits), (Some(a), Some(b)) if b > a),
        "{names:?}"
    );
    let ppl = outcome.perplexity.as_ref().unwrap().perplexity;
    assert!(ppl.is_finite() && ppl > 1.0, "{ppl}");
    // Where the time went: every phase of a streamed Wanda run with
    // evaluation, and the main kinds of work, each within the wall time.
    let r = &outcome.summary.results;
    for (key, names) in [
        (
            "seconds_by_phase",
            &["load_layer", "stats_pass", "prune", "output_pass", "eval"][..],
        ),
        (
            "seconds_by_work",
            &[
                "gemm",
                "attention",
                "norms_rope_activations",
                "statistics",
                "selection",
                "checkpoint_io",
                "logits",
            ][..],
        ),
    ] {
        let m = r[key]
            .as_object()
            .unwrap_or_else(|| panic!("{key} in {r:?}"));
        for n in names {
            let v = m.get(*n).and_then(|v| v.as_f64()).unwrap_or(0.0);
            assert!(v > 0.0 && v <= outcome.summary.wall_s, "{key}.{n} = {v}");
        }
        let total: f64 = m.values().filter_map(|v| v.as_f64()).sum();
        assert!(
            total <= outcome.summary.wall_s * 1.01,
            "{key} sums within the wall time: {total}"
        );
    }

    // The binary runs the same job: the same sparsity and perplexity.
    let (code, out, err) = run_prunemem(&[
        "prune",
        "--model",
        s(&model),
        "--method",
        "wanda",
        "--nsamples",
        "8",
        "--seqlen",
        "64",
        "--calib-text",
        s(&text),
        "--eval-text",
        s(&text),
        "--eval-windows",
        "2",
        "--ui",
        "none",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let j = json_line(&out);
    assert_eq!(j["perplexity"].as_f64(), Some(ppl));
    assert_eq!(j["sparsity"].as_f64(), Some(outcome.prune.sparsity()));
}

#[test]
fn a_refused_job_names_the_setting_and_starts_no_run() {
    let mut job = PruneJob::new("/nonexistent/model", Method::SparseGpt);
    job.sparsity = 1.5;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let Err(JobError::Config(e)) = jobs::prune::run(&job, options(&seen)) else {
        panic!("a sparsity of 1.5 must be refused");
    };
    assert_eq!(e.fields, vec![Field::Sparsity]);
    assert_eq!(e.to_string(), "sparsity must be in [0, 1), got 1.5");
    assert!(
        seen.lock().unwrap().is_empty(),
        "no event before validation"
    );
    job.sparsity = 0.5;
    let Err(JobError::Config(e)) = jobs::prune::run(&job, options(&seen)) else {
        panic!("sparsegpt without calibration text must be refused");
    };
    assert_eq!(e.fields, vec![Field::CalibText, Field::Method]);
}

#[test]
fn gradprobe_iterates_inside_the_engine() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let (_dir, model, _, src) = fixture();
    let mut job = PruneJob::new(s(&model), Method::GradProbe);
    job.seqlen = Some(32);
    job.calib = Some(src.clone());
    job.eval = Some(src);
    job.eval_windows = Some(2);
    job.gradprobe.iterative = true;
    job.gradprobe.max_ppl_increase = 1e9;
    job.gradprobe.sparsity_step = 0.3;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let outcome = jobs::prune::run(&job, options(&seen)).unwrap();
    let events = seen.lock().unwrap().clone();
    let Some(Event::RunFinished { summary }) = events.last() else {
        panic!("no final event");
    };
    let steps = summary.results["iterations"].as_array().unwrap();
    let dense = summary.results["dense_perplexity"].as_f64().unwrap();
    let field = |step: &serde_json::Value, k: &str| step[k].as_f64().unwrap();
    // Targets 0.1, 0.4, 0.7, …: the kept step is the last one before the
    // first whose perplexity exceeds the budget.
    assert!(steps.len() >= 2, "{steps:?}");
    let within = steps
        .iter()
        .take_while(|st| field(st, "perplexity") - dense <= job.gradprobe.max_ppl_increase)
        .last()
        .expect("the first step is within a budget of 1e9");
    let kept =
        prunemem::prune::engine::sparsity_of(outcome.prune.layers.iter().flat_map(|l| &l.linears));
    assert_eq!(kept, field(within, "sparsity"), "{steps:?}");
    assert!(
        kept > field(&steps[0], "sparsity"),
        "sparsity rose over the steps"
    );
    assert_eq!(
        outcome.perplexity.unwrap().perplexity,
        field(within, "perplexity")
    );
    assert!(summary.results.contains_key("dense_perplexity"));
}
