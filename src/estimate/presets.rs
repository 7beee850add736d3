//! Model presets (`profiles/models/*.json`, embedded in the binary) and the
//! architecture `--params N` assumes: the preset nearest in size, scaled to
//! N with its proportions kept.

use super::{Arch, EstimateError};
use crate::model::LlamaConfig;

macro_rules! preset {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../profiles/models/", $name, ".json")),
        )
    };
}

/// Preset files by name.
pub const PRESETS: &[(&str, &str)] = &[
    preset!("smollm2-135m"),
    preset!("llama-3.2-1b"),
    preset!("llama-3.2-3b"),
    preset!("llama-7b"),
    preset!("llama-2-7b"),
    preset!("mistral-7b"),
    preset!("llama-3.1-8b"),
    preset!("llama-13b"),
    preset!("llama-2-13b"),
    preset!("llama-30b"),
    preset!("llama-65b"),
    preset!("llama-2-70b"),
];

/// The presets `--params` scales from: one lineage per size (the original
/// LLaMA shapes, LLaMA 3.2 below 7B, SmolLM2 for the smallest), so `7e9`
/// assumes LLaMA 7B's proportions rather than Mistral's 7.2B.
const SCALING_BASES: &[&str] = &[
    "smollm2-135m",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-7b",
    "llama-13b",
    "llama-30b",
    "llama-65b",
    "llama-2-70b",
];

/// The presets `--params` snaps to when it names their size, in the order
/// a tie is settled: `7e9` means Llama 2 7B (the Wanda and SparseGPT
/// papers' model), not Mistral's 7.2B.
const SNAP_ORDER: &[&str] = &[
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.1-8b",
    "llama-30b",
    "llama-65b",
    "smollm2-135m",
];

/// How close `--params` must be to a preset's nominal size ("7B") or to its
/// exact count to snap to it.
const SNAP_NOMINAL: f64 = 0.05;
const SNAP_EXACT: f64 = 0.02;

/// The size in a preset's name: "Llama 2 7B" → 7e9, "SmolLM2-135M" → 1.35e8.
fn nominal(label: &str) -> Option<f64> {
    let last = label.rsplit([' ', '-']).find(|t| t.ends_with(['B', 'M']))?;
    let (num, unit) = last.split_at(last.len() - 1);
    let v: f64 = num.parse().ok()?;
    Some(v * if unit == "B" { 1e9 } else { 1e6 })
}

/// The architecture `--params N` means, and a sentence saying how it was
/// chosen: the preset whose nominal size (within 5%) or exact count (within
/// 2%) is N, or else the nearest preset scaled to N.
pub fn for_params(params: u64) -> Result<(Arch, String), EstimateError> {
    let n = params as f64;
    for name in SNAP_ORDER {
        let arch = load(name)?;
        let close = |v: f64| (n / v - 1.0).abs();
        if nominal(&arch.name).is_some_and(|v| close(v) <= SNAP_NOMINAL)
            || close(arch.params as f64) <= SNAP_EXACT
        {
            let note = format!(
                "--params {}: the {} preset ({} parameters, {} layers, hidden {}); --model PRESET picks another",
                crate::units::format_count(params),
                arch.name,
                crate::units::format_count(arch.params),
                arch.layers,
                arch.hidden
            );
            return Ok((arch, note));
        }
    }
    let arch = scaled(params)?;
    let note = format!(
        "--params {}: no preset is that size; assumed {} — hidden {}, {} layers, {} heads ({} kv), head_dim {}, intermediate {}, vocab {}",
        crate::units::format_count(params),
        arch.name,
        arch.hidden,
        arch.layers,
        arch.heads,
        arch.kv_heads,
        arch.head_dim,
        arch.intermediate,
        arch.vocab
    );
    Ok((arch, note))
}

/// Largest parameter count `--params` accepts.
pub const MAX_PARAMS: u64 = 10_000_000_000_000;

fn normalise(s: &str) -> String {
    s.to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect()
}

/// A preset's display name and architecture.
pub fn load(key: &str) -> Result<Arch, EstimateError> {
    let want = normalise(key);
    for (name, text) in PRESETS {
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| EstimateError::Invalid(format!("preset {name}: {e}")))?;
        let label = json["_name"].as_str().unwrap_or(name);
        if normalise(name) == want || normalise(label) == want {
            let config = LlamaConfig::from_json(text)?;
            return Ok(Arch::from_config(label, &config));
        }
    }
    let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
    Err(EstimateError::Invalid(format!(
        "unknown preset '{key}' (presets: {})",
        names.join(", ")
    )))
}

/// Every preset, in catalogue order.
pub fn all() -> Vec<Arch> {
    PRESETS.iter().filter_map(|(n, _)| load(n).ok()).collect()
}

fn round_to(v: f64, step: u64) -> u64 {
    ((v / step as f64).round() as u64).max(1) * step
}

/// The architecture assumed for `params` parameters: the preset whose size
/// is nearest (in ratio), scaled by `(params / preset)^(1/3)` in width, with
/// the depth then chosen to land on `params`.
pub fn scaled(params: u64) -> Result<Arch, EstimateError> {
    if params == 0 {
        return Err(EstimateError::Invalid("--params must be positive".into()));
    }
    if params > MAX_PARAMS {
        return Err(EstimateError::Invalid(format!(
            "--params {params} is above {MAX_PARAMS} (10 trillion); check the number"
        )));
    }
    let base = SCALING_BASES
        .iter()
        .filter_map(|n| load(n).ok())
        .min_by(|a, b| {
            let da = (params as f64 / a.params as f64).ln().abs();
            let db = (params as f64 / b.params as f64).ln().abs();
            da.total_cmp(&db)
        })
        .ok_or_else(|| EstimateError::Invalid("no presets".into()))?;
    let g = (params as f64 / base.params as f64).cbrt();
    let d = base.head_dim;
    let group = base.heads / base.kv_heads.max(1);
    let hidden = round_to(base.hidden as f64 * g, (d * group).max(64));
    let heads = (hidden / d).max(1);
    let kv_heads = (heads / group.max(1)).max(1);
    let intermediate = round_to(
        base.intermediate as f64 * hidden as f64 / base.hidden as f64,
        64,
    );
    let mut arch = Arch {
        name: String::new(),
        params: 0,
        layers: 1,
        hidden,
        intermediate,
        heads,
        kv_heads,
        head_dim: d,
        vocab: base.vocab,
        tied: base.tied,
        max_positions: base.max_positions,
    };
    let fixed = arch.embedding_params() * if arch.tied { 1 } else { 2 } + hidden;
    let per_layer = arch.layer_params();
    arch.layers = ((params.saturating_sub(fixed)) as f64 / per_layer as f64)
        .round()
        .max(1.0) as u64;
    arch.params = fixed + arch.layers * per_layer;
    arch.name = format!(
        "{} scaled to {}",
        base.name,
        crate::units::format_count(params)
    );
    Ok(arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_load_with_known_sizes() {
        assert_eq!(load("smollm2-135m").unwrap().params, 134_515_008);
        let l7 = load("llama-7b").unwrap();
        assert_eq!(l7.params, 6_738_415_616);
        assert_eq!(load("LLaMA 7B").unwrap(), l7);
        assert!(load("llama-2-70b").unwrap().params > 68_000_000_000);
        assert!(load("gpt-4").is_err());
        assert_eq!(all().len(), PRESETS.len());
    }

    #[test]
    fn params_snap_to_the_preset_of_that_size() {
        let name = |n: u64| for_params(n).unwrap().0.name;
        assert_eq!(name(7_000_000_000), "Llama 2 7B");
        assert_eq!(name(6_738_415_616), "Llama 2 7B");
        assert_eq!(name(8_000_000_000), "Llama 3.1 8B");
        assert_eq!(name(1_000_000_000), "LLaMA 3.2 1B");
        assert_eq!(name(70_000_000_000), "Llama 2 70B");
        assert_eq!(name(135_000_000), "SmolLM2-135M");
        let (a, note) = for_params(20_000_000_000).unwrap();
        assert!(a.name.contains("scaled to"), "{}", a.name);
        assert!(note.contains("no preset"), "{note}");
        assert_eq!(nominal("Llama 3.2 1B"), Some(1e9));
        assert_eq!(nominal("Mistral 7B v0.1"), Some(7e9));
    }

    #[test]
    fn params_pick_and_scale_the_nearest_preset() {
        let a = scaled(7_000_000_000).unwrap();
        assert!(a.name.starts_with("LLaMA 7B"), "{}", a.name);
        assert!((a.params as f64 / 7e9 - 1.0).abs() < 0.05, "{}", a.params);
        let b = scaled(20_000_000_000).unwrap();
        assert!((b.params as f64 / 2e10 - 1.0).abs() < 0.05, "{}", b.params);
        assert_eq!(b.hidden % b.head_dim, 0);
        assert!(scaled(0).is_err());
        assert!(scaled(10_000_000_000_000_000).is_err());
    }
}
