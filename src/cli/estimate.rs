//! `prunemem estimate`: memory before you run (or buy): a breakdown per
//! phase, the peak, which GPUs fit, the largest sizes that fit a budget, the
//! quick-reference table, and estimates checked against measured runs.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;

use super::CliResult;
use crate::data::windows::resolve_seqlen;
use crate::estimate::{
    Arch, Device, Engine, Estimate, Optimizer, Task, Workload, against, catalog, estimate, fit,
    presets,
};
use crate::model::{ComputeDtype, LlamaConfig};
use crate::units::{format_bytes, format_count, parse_count, parse_size};

#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// Parameter count (7e9, 7B, 1.2b): architecture scaled from the nearest preset
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    params: Option<String>,
    /// Model folder, config.json, or preset name (smollm2-135m, llama-7b, mistral-7b...)
    #[arg(long, value_name = "DIR|FILE|PRESET")]
    model: Option<String>,
    /// magnitude, wanda, sparsegpt, gradprobe, inference or train
    #[arg(long, alias = "prune_method", default_value = "wanda")]
    method: Task,
    /// unstructured or N:M (memory is the same; recorded for the plan)
    #[arg(long, alias = "sparsity_type", default_value = "unstructured")]
    sparsity_type: String,
    /// Calibration windows
    #[arg(long, default_value_t = 128)]
    nsamples: u64,
    /// Window length (capped at the model's max positions)
    #[arg(long, default_value_t = 2048)]
    seqlen: u64,
    /// Windows per forward pass (default 8 for prunemem, 1 for the reference)
    #[arg(long)]
    batch_size: Option<u64>,
    /// Gradient accumulation steps (train)
    #[arg(long, default_value_t = 1)]
    grad_accum: u64,
    /// Optimizer (train): adamw, adam (the same memory) or sgd (no momentum)
    #[arg(long, default_value = "adamw", value_parser = ["adamw", "adam", "sgd"])]
    optimizer: String,
    /// Train with activation checkpointing per decoder layer (prunemem's engine)
    #[arg(long)]
    checkpointing: bool,
    /// Pruning with OWL's outlier pass first (prunemem's engine)
    #[arg(long)]
    owl: bool,
    /// Pruning with DSnoT's mask refinement (prunemem's engine)
    #[arg(long)]
    dsnot: bool,
    /// DSnoT: linears left with their first mask: mlp, self_attn or none
    #[arg(long, default_value = "mlp", requires = "dsnot")]
    dsnot_skip: crate::prune::dsnot::DsnotSkip,
    /// RIA, N:M: with the channel reallocation (prunemem's engine, on a device)
    #[arg(long)]
    reallocation: bool,
    /// RIA, N:M, with --reallocation: and the assignment rounds
    #[arg(long, requires = "reallocation")]
    lsa: bool,
    /// Wanda, unstructured: the α-variant (--use-variant; on a device, its sorted tables)
    #[arg(long, alias = "use_variant")]
    use_variant: bool,
    /// Pruning: the size of a --save-format compressed save too (sparse-24-bitmask for 2:4, sparse-bitmask otherwise)
    #[arg(long, default_value = "dense")]
    save_format: crate::jobs::config::SaveFormat,
    /// Compute dtype (default: f16 on cuda, f32 on cpu)
    #[arg(long)]
    dtype: Option<ComputeDtype>,
    /// cpu, cuda or wgpu (wgpu: prunemem's engine only)
    #[arg(long, default_value = "cuda", value_parser = ["cpu", "cuda", "wgpu"])]
    device: String,
    /// prunemem on a device: calibration activations in host memory
    #[arg(long)]
    offload_activations: bool,
    /// prunemem across MPI ranks: each rank's peak and the bytes exchanged per layer
    #[arg(long, default_value_t = 1)]
    ranks: u64,
    /// prunemem (layer-streamed) or reference (the Python scripts)
    #[arg(long, default_value = "prunemem", value_parser = ["prunemem", "reference"])]
    engine: String,
    /// prunemem: keep the whole model loaded
    #[arg(long)]
    resident: bool,
    /// Evaluation windows after pruning
    #[arg(long, default_value_t = 0)]
    eval_windows: u64,
    /// GradProbe: sparsity, batches, embeddings included
    #[arg(long, default_value_t = 0.1)]
    sparsity: f64,
    #[arg(long, default_value_t = 1)]
    num_batches: u64,
    #[arg(long)]
    include_embeddings: bool,
    /// Check against this GPU only
    #[arg(long, value_name = "NAME")]
    gpu: Option<String>,
    /// The largest seqlen / nsamples / batch that fit this memory (24GiB, 80GB...)
    #[arg(long, value_name = "SIZE")]
    fit: Option<String>,
    /// The quick-reference table for LLaMA 1B-70B
    #[arg(long)]
    table: bool,
    /// Compare with a finished run's events.jsonl
    #[arg(long, value_name = "LOGDIR")]
    against: Option<PathBuf>,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

fn arch_of(args: &EstimateArgs) -> CliResult<(Arch, Vec<String>)> {
    let mut notes = Vec::new();
    if let Some(p) = &args.params {
        if args.model.is_some() {
            return Err("give --params or --model, not both".into());
        }
        let n = parse_count(p)?;
        let (arch, note) = presets::for_params(n)?;
        notes.push(note);
        return Ok((arch, notes));
    }
    let Some(m) = &args.model else {
        return Err(
            "give --params N, --model DIR|config.json|PRESET, --table or --against LOGDIR".into(),
        );
    };
    let path = Path::new(m);
    let config_path = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if config_path.is_file() {
        let config = LlamaConfig::from_file(&config_path)?;
        return Ok((Arch::from_config(m, &config), notes));
    }
    Ok((presets::load(m)?, notes))
}

fn workload(args: &EstimateArgs, arch: &Arch, notes: &mut Vec<String>) -> CliResult<Workload> {
    let device = match args.device.as_str() {
        "cpu" => Device::Cpu,
        "wgpu" => Device::Wgpu,
        _ => Device::Cuda,
    };
    let engine = if args.engine == "reference" {
        Engine::Reference
    } else {
        Engine::Prunemem
    };
    let mut w = Workload::new(args.method);
    w.engine = engine;
    w.device = device;
    // prunemem's GradProbe computes in f32 on every device (its `prune`
    // refuses another dtype).
    w.dtype = args.dtype.unwrap_or(match device {
        _ if args.method == Task::GradProbe && engine == Engine::Prunemem => ComputeDtype::F32,
        Device::Cuda | Device::Wgpu => ComputeDtype::F16,
        Device::Cpu => ComputeDtype::F32,
    });
    if device == Device::Wgpu && w.dtype == ComputeDtype::Bf16 {
        return Err(
            "--device wgpu has no bf16 (Vulkan has no bf16): use --dtype f16 or f32".into(),
        );
    }
    w.offload_activations = args.offload_activations;
    device_kernels(&mut w);
    w.stored_bytes = w.dtype.size();
    w.nsamples = args.nsamples;
    let (seqlen, warning) =
        resolve_seqlen(Some(args.seqlen as usize), arch.max_positions as usize)?;
    if let Some(warning) = warning {
        notes.push(warning);
    }
    w.seqlen = seqlen as u64;
    w.batch_size = args.batch_size.unwrap_or(match (engine, args.method) {
        // GradProbe's `prune` takes one window a batch unless told.
        (_, Task::Inference | Task::Train | Task::GradProbe) => 1,
        (Engine::Reference, _) => 1,
        (Engine::Prunemem, _) => 8,
    });
    w.grad_accum = args.grad_accum;
    w.optimizer = if args.optimizer == "sgd" {
        Optimizer::Sgd
    } else {
        Optimizer::AdamW
    };
    w.checkpointing = args.checkpointing;
    w.owl = args.owl;
    w.dsnot = args.dsnot;
    w.dsnot_skip = args.dsnot_skip;
    w.resident = args.resident;
    w.eval_windows = args.eval_windows;
    w.sparsity = args.sparsity;
    w.num_batches = args.num_batches;
    w.include_embeddings = args.include_embeddings;
    sparsity_pattern(args, &mut w)?;
    // A streamed prune evaluates each layer as it is pruned where the
    // run's own choice would (the memory unknown here).
    w.eval_inline = w.inline_by_default(arch);
    // The model's own tokenizer, beside its config.json.
    w.tokenizer = args
        .model
        .as_deref()
        .map(Path::new)
        .and_then(|p| if p.is_dir() { Some(p) } else { p.parent() })
        .map(|dir| dir.join("tokenizer.json"))
        .filter(|t| t.is_file())
        .and_then(|t| crate::model::tokenizer_size::TokenizerSize::read(&t).ok());
    Ok(w)
}

/// The kernels a run on the workload's device and dtype would take: the
/// attention kernel as `PRUNEMEM_ATTENTION` (else what was measured there)
/// chooses, the others wherever there is a GPU.
fn device_kernels(w: &mut Workload) {
    let gpu = w.device.is_gpu();
    w.fused_attention = gpu
        && crate::exec::attention::planned(w.device == Device::Cuda, w.dtype == ComputeDtype::F16)
            != "fallback";
    w.swiglu_kernel = gpu;
    w.swiglu_in_place = gpu;
    w.norms_kernel = gpu;
    w.rms_norm_kernel = gpu;
    w.dsnot_kernel = gpu && crate::exec::swap_loop::one_launch();
}

/// The sparsity and its pattern (N:M sets both, and RIA's reallocation
/// only applies there), the saved format, and a compressed model folder's
/// own format, sparsity and stored width.
fn sparsity_pattern(args: &EstimateArgs, w: &mut Workload) -> CliResult<()> {
    if !(0.0..1.0).contains(&w.sparsity) {
        return Err(format!("--sparsity must be in [0, 1), got {}", w.sparsity).into());
    }
    let pattern = args
        .sparsity_type
        .parse::<crate::prune::Pattern>()
        .map_err(|e| -> super::CliError { e.into() })?;
    if let crate::prune::Pattern::NM { n, m } = pattern {
        w.sparsity = n as f64 / m as f64;
        w.nm = true;
        w.group = m as u64;
    }
    w.reallocation = w.nm && args.reallocation;
    w.lsa = w.reallocation && args.lsa;
    w.use_variant = args.use_variant && !w.nm;
    w.compressed = args.save_format.sparse_format(pattern, false);
    if let Some(dir) = args.model.as_deref().map(Path::new).filter(|p| p.is_dir())
        && let Some(format) = crate::model::compressed::declared_format(dir)
    {
        w.compressed = Some(format);
        w.sparsity = crate::model::compressed::declared_sparsity(dir).unwrap_or(w.sparsity);
        w.stored_bytes = crate::model::compressed::stored_width(dir).unwrap_or(w.stored_bytes);
    }
    Ok(())
}

pub fn run(args: EstimateArgs) -> CliResult<i32> {
    if let Some(dir) = &args.against {
        return run_against(dir, args.json);
    }
    if args.table {
        return run_table(&args);
    }
    let (arch, mut notes) = arch_of(&args)?;
    let mut w = workload(&args, &arch, &mut notes)?;
    let ranks = split_across_ranks(args.ranks, &arch, &mut w, &mut notes)?;
    let est = estimate(&arch, &w)?;
    notes.extend(est.notes.iter().cloned());
    let reference = reference_of(&arch, &w, ranks.as_ref().map(|(_, all)| *all))?;
    let gpus = match &args.gpu {
        Some(name) => vec![catalog::find(name)?],
        None => catalog::all(),
    };
    let limits = match &args.fit {
        Some(size) => Some(fit::limits(&arch, &w, parse_size(size)?)?),
        None => None,
    };
    if args.json {
        let fits: Vec<_> = gpus
            .iter()
            .map(|g| json!({"gpu": g.name, "usable": g.usable(), "fits": est.device_need() <= g.usable()}))
            .collect();
        let smallest = catalog::smallest_fitting(est.device_need(), 0.0).map(|g| g.name);
        println!(
            "{}",
            json!({
                "estimate": est, "peak": est.peak(), "peak_allocated": est.peak_allocated(),
                "peak_phase": est.phases[est.peak_phase()].name,
                "gpus": fits, "smallest_gpu": smallest,
                "reference_peak": reference.as_ref().map(Estimate::peak), "fit": limits, "notes": notes,
                "ranks": ranks.as_ref().map(|(share, _)| share),
            })
        );
        return Ok(0);
    }
    print!(
        "{}",
        crate::report::estimate::render(&est, reference.as_ref(), &gpus, w.device)
    );
    if let Some(l) = &limits {
        print_limits(l, w.task, args.fit.as_deref());
    }
    for n in &notes {
        println!("note: {n}");
    }
    Ok(0)
}

/// `--ranks N`: one rank's share of the calibration windows, said in a
/// note; `w` becomes one rank's workload. Returns the share and the windows
/// of the whole run.
fn split_across_ranks(
    ranks: u64,
    arch: &Arch,
    w: &mut Workload,
    notes: &mut Vec<String>,
) -> CliResult<Option<(crate::estimate::ranks::RankShare, u64)>> {
    match ranks {
        0 => Err("--ranks must be at least 1".into()),
        n if n > 1 << 20 => {
            Err(format!("--ranks {n} is past any MPI world (at most 1048576)").into())
        }
        1 => Ok(None),
        n if w.engine != Engine::Prunemem => {
            Err(format!("--ranks {n}: only prunemem's engine runs across ranks").into())
        }
        n => {
            let all_windows = w.nsamples;
            let share = crate::estimate::ranks::share(arch, w, n);
            notes.push(format!(
                "{n} ranks: each rank holds at most {} of the {} calibration windows (the figures below are one rank's); per layer {} of statistics go to rank 0 and back ({} through rank 0)",
                share.windows_per_rank,
                w.nsamples,
                format_bytes(share.statistics_per_layer),
                format_bytes(share.rank0_traffic_per_layer),
            ));
            w.nsamples = share.windows_per_rank;
            Ok(Some((share, all_windows)))
        }
    }
}

/// The same pruning run on the reference scripts (batch 1, every window in
/// one process, on CUDA where prunemem would use wgpu); none for inference
/// or training, or when the reference is what was asked.
fn reference_of(
    arch: &Arch,
    w: &Workload,
    all_windows: Option<u64>,
) -> CliResult<Option<Estimate>> {
    if w.engine != Engine::Prunemem || matches!(w.task, Task::Inference | Task::Train) {
        return Ok(None);
    }
    let mut r = w.clone();
    r.engine = Engine::Reference;
    r.batch_size = 1;
    if let Some(all) = all_windows {
        r.nsamples = all;
    }
    if r.device == Device::Wgpu {
        r.device = Device::Cuda;
    }
    Ok(Some(estimate(arch, &r)?))
}

/// `--fit SIZE`'s answer: the largest of each size that fits, the others
/// as given.
fn print_limits(l: &fit::FitLimits, task: Task, fit_arg: Option<&str>) {
    let show = |v: Option<u64>| {
        v.map(|x| x.to_string())
            .unwrap_or_else(|| "none fits".into())
    };
    println!(
        "\nLargest that fits {} (others as given):",
        format_bytes(l.budget)
    );
    println!("  seqlen      {}", show(l.max_seqlen));
    if l.max_nsamples.is_some()
        || matches!(
            task,
            Task::Wanda | Task::Ria | Task::SparseGpt | Task::GradProbe
        )
    {
        println!("  nsamples    {}", show(l.max_nsamples));
    }
    println!("  batch size  {}", show(l.max_batch_size));
    if let Some(e) = l.max_eval_windows {
        println!("  eval windows {e}");
    }
    if let Some(size) = fit_arg
        && size.to_ascii_lowercase().ends_with("gb")
    {
        println!(
            "  ({size} read as decimal gigabytes = {}; cards sold as \"{size}\" hold that many GiB: write {}GiB for those)",
            format_bytes(l.budget),
            size.trim_end_matches(|c: char| c.is_ascii_alphabetic())
        );
    }
}

fn run_table(args: &EstimateArgs) -> CliResult<i32> {
    let rows = [
        ("1B", "llama-3.2-1b"),
        ("3B", "llama-3.2-3b"),
        ("7B", "llama-7b"),
        ("13B", "llama-13b"),
        ("30B", "llama-30b"),
        ("65B", "llama-65b"),
        ("70B", "llama-2-70b"),
    ];
    let mut out = Vec::new();
    for (label, preset) in rows {
        let arch = presets::load(preset)?;
        let mut notes = Vec::new();
        let w = workload(args, &arch, &mut notes)?;
        let est = estimate(&arch, &w)?;
        let weights_fp16 = arch.params * 2;
        let peak = est.peak();
        let weights = est.phases[est.peak_phase()]
            .components
            .iter()
            .filter(|c| {
                c.name.starts_with("weights")
                    || c.name.contains("runtime")
                    || c.name.contains("context")
            })
            .map(|c| c.bytes)
            .sum::<u64>();
        out.push((
            label,
            arch.name.clone(),
            arch.params,
            weights_fp16,
            peak.saturating_sub(weights),
            peak,
            catalog::smallest_fitting(peak, 0.0).map(|g| g.name),
            catalog::smallest_fitting(peak, 0.2).map(|g| g.name),
        ));
    }
    if args.json {
        let rows: Vec<_> = out
            .iter()
            .map(|r| json!({"size": r.0, "model": r.1, "params": r.2, "model_fp16": r.3, "activations": r.4,
                            "total": r.5, "minimum_gpu": r.6, "recommended_gpu": r.7}))
            .collect();
        println!("{}", json!(rows));
        return Ok(0);
    }
    println!(
        "{:<5} {:<12} {:>10} {:>12} {:>13} {:>12}  {:<16} {:<16}",
        "size",
        "model",
        "params",
        "model fp16",
        "activations",
        "total",
        "minimum GPU",
        "recommended GPU"
    );
    for r in out {
        println!(
            "{:<5} {:<12} {:>10} {:>12} {:>13} {:>12}  {:<16} {:<16}",
            r.0,
            r.1,
            format_count(r.2),
            format_bytes(r.3),
            format_bytes(r.4),
            format_bytes(r.5),
            r.6.unwrap_or_else(|| "none".into()),
            r.7.unwrap_or_else(|| "none".into())
        );
    }
    println!(
        "(method {:?}, {} engine, {} samples × {} tokens; recommended leaves 20% headroom)",
        args.method, args.engine, args.nsamples, args.seqlen
    );
    Ok(0)
}

fn run_against(dir: &Path, as_json: bool) -> CliResult<i32> {
    let events = against::read_events(dir)?;
    let cmp = against::compare(&events)?;
    // A distributed run: every rank's peak from its own log.
    let ranks = crate::events::ranks::read(dir)
        .ok()
        .flatten()
        .map(|r| against::rank_checks(&cmp, &r))
        .unwrap_or_default();
    if as_json {
        println!(
            "{}",
            json!({"phases": cmp.phases, "peak": cmp.peak, "reserved": cmp.reserved, "ranks": ranks, "notes": cmp.estimate.notes})
        );
        return Ok(0);
    }
    let on_device = cmp.estimate.workload.device.is_gpu();
    let what = match on_device {
        true => "device pool in use",
        false => "RSS",
    };
    println!("Estimate vs measured ({what}) for {}", dir.display());
    println!(
        "{:<20} {:>12} {:>12} {:>9}",
        "phase", "predicted", "measured", "error"
    );
    for p in cmp
        .phases
        .iter()
        .chain(std::iter::once(&cmp.peak))
        .chain(&cmp.reserved)
        .chain(&ranks)
    {
        println!(
            "{:<20} {:>12} {:>12} {:>9}",
            p.phase,
            format_bytes(p.predicted),
            p.measured.map(format_bytes).unwrap_or_else(|| "n/a".into()),
            p.error_percent
                .map(|e| format!("{e:+.1}%"))
                .unwrap_or_else(|| "n/a".into())
        );
    }
    print_categories(&cmp.phases, on_device);
    for note in &cmp.estimate.notes {
        println!("note: {note}");
    }
    if on_device {
        println!("\nPredicted device pool by component at each phase's peak");
        for p in &cmp.estimate.phases {
            let parts: Vec<String> = p
                .components
                .iter()
                .map(|c| format!("{} {}", c.name, format_bytes(c.bytes)))
                .collect();
            println!("  {:<12} {}", p.name, parts.join(" · "));
        }
    }
    Ok(0)
}

/// One row per category, one "predicted / measured" column per phase.
fn print_categories(phases: &[against::PhaseCheck], on_device: bool) {
    let cats = against::phase_categories(phases);
    if cats.is_empty() {
        return;
    }
    let rest = match on_device {
        true => "the rest of the pool's peak: untagged intermediates",
        false => "the rest of the phase's peak, non-heap included",
    };
    println!("\nBy category at each phase's peak, predicted / measured (measured runtime: {rest})");
    print!("{:<12}", "category");
    for p in phases {
        print!(" {:>23}", p.phase);
    }
    println!();
    for c in cats {
        print!("{:<12}", c.name());
        for p in phases {
            print!(" {:>23}", p.cell(c));
        }
        println!();
    }
}
