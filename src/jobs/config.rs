//! Typed job configurations and the one place they are checked.
//!
//! A configuration validates itself into a [`ConfigError`] that names the
//! offending settings as [`Field`]s, not as command-line flags: the library
//! prints them by their setting names (`sparsity`), the CLI maps each field
//! to its flag (`--sparsity`), and any other front end can do the same.

use std::fmt;
use std::path::PathBuf;

use thiserror::Error;

use crate::data::LineRange;
use crate::model::ComputeDtype;
use crate::prune::gradprobe::{GradPrecision, Strategy};
use crate::prune::{Method, Pattern};

/// A setting of a job, as errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Method,
    Sparsity,
    SparsityType,
    Nsamples,
    BatchSize,
    Blocksize,
    Percdamp,
    EvalWindows,
    UseVariant,
    CalibText,
    EvalText,
    Dtype,
    Resident,
    NumBatches,
    Stride,
    ReductionFactor,
    GradientThreshold,
    Iterative,
    InitialSparsity,
    SparsityStep,
    MaxPplIncrease,
    /// `eval`: how many windows of its text.
    Windows,
    EvalDense,
    RiaA,
    PerOutneuron,
    Owl,
    OwlLambda,
    OwlM,
    SaveFormat,
    Save,
    Reallocation,
    Lsa,
    Dsnot,
    DsnotMaxCycles,
    DsnotThreshold,
    DsnotPowVar,
}

impl Field {
    /// The setting's name (`sparsity_type`): the key in a run's plan, and
    /// the CLI's flag with `_` as `-`.
    pub fn key(self) -> &'static str {
        match self {
            Field::Method => "method",
            Field::Sparsity => "sparsity",
            Field::SparsityType => "sparsity_type",
            Field::Nsamples => "nsamples",
            Field::BatchSize => "batch_size",
            Field::Blocksize => "blocksize",
            Field::Percdamp => "percdamp",
            Field::EvalWindows => "eval_windows",
            Field::UseVariant => "use_variant",
            Field::CalibText => "calib_text",
            Field::EvalText => "eval_text",
            Field::Dtype => "dtype",
            Field::Resident => "resident",
            Field::NumBatches => "num_batches",
            Field::Stride => "stride",
            Field::ReductionFactor => "reduction_factor",
            Field::GradientThreshold => "gradient_threshold",
            Field::Iterative => "iterative",
            Field::InitialSparsity => "initial_sparsity",
            Field::SparsityStep => "sparsity_step",
            Field::MaxPplIncrease => "max_ppl_increase",
            Field::Windows => "windows",
            Field::EvalDense => "eval_dense",
            Field::RiaA => "ria_a",
            Field::PerOutneuron => "per_outneuron",
            Field::Owl => "owl",
            Field::OwlLambda => "owl_lambda",
            Field::OwlM => "owl_m",
            Field::SaveFormat => "save_format",
            Field::Save => "save",
            Field::Reallocation => "reallocation",
            Field::Lsa => "lsa",
            Field::Dsnot => "dsnot",
            Field::DsnotMaxCycles => "dsnot_max_cycles",
            Field::DsnotThreshold => "dsnot_threshold",
            Field::DsnotPowVar => "dsnot_pow_var",
        }
    }
}

/// A configuration a job refuses. Its text holds one `{}` per field, in
/// order; [`ConfigError::render`] fills them with the names a front end
/// uses.
#[derive(Debug, Clone, PartialEq, Error)]
pub struct ConfigError {
    text: String,
    pub fields: Vec<Field>,
}

impl ConfigError {
    /// `text` with one `{}` for each of `fields`.
    pub fn new(text: impl Into<String>, fields: &[Field]) -> Self {
        Self {
            text: text.into(),
            fields: fields.to_vec(),
        }
    }

    /// The message with each field named by `name`.
    pub fn render(&self, name: impl Fn(Field) -> String) -> String {
        let mut out = String::new();
        let mut parts = self.text.split("{}");
        out.push_str(parts.next().unwrap_or_default());
        for (k, part) in parts.enumerate() {
            match self.fields.get(k) {
                Some(f) => out.push_str(&name(*f)),
                None => out.push_str("{}"),
            }
            out.push_str(part);
        }
        out
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(|field| field.key().to_string()))
    }
}

fn bad(text: impl Into<String>, fields: &[Field]) -> Result<(), ConfigError> {
    Err(ConfigError::new(text, fields))
}

/// A text file and the lines of it to use.
#[derive(Debug, Clone)]
pub struct TextSource {
    pub path: PathBuf,
    pub lines: LineRange,
}

/// How a pruned model is saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SaveFormat {
    /// The input's layout: same names, dtype and files, zeros stored.
    Dense,
    /// compressed-tensors: `sparse-24-bitmask` for 2:4, `sparse-bitmask` otherwise.
    Compressed,
}

impl std::str::FromStr for SaveFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dense" => Ok(SaveFormat::Dense),
            "compressed" => Ok(SaveFormat::Compressed),
            other => Err(format!(
                "unknown save format '{other}' (expected dense or compressed)"
            )),
        }
    }
}

impl SaveFormat {
    /// The compressed-tensors format for `pattern` (`None`: dense); a
    /// `permuted` N:M mask is not N:M in the stored order.
    pub fn sparse_format(
        self,
        pattern: Pattern,
        permuted: bool,
    ) -> Option<crate::model::compressed::SparseFormat> {
        use crate::model::compressed::SparseFormat;
        match (self, pattern) {
            (SaveFormat::Dense, _) => None,
            (SaveFormat::Compressed, Pattern::NM { n: 2, m: 4 }) if !permuted => {
                Some(SparseFormat::TwoFour)
            }
            (SaveFormat::Compressed, _) => Some(SparseFormat::Bitmask),
        }
    }
}

/// GradProbe's settings (defaults are the reference's).
#[derive(Debug, Clone)]
pub struct GradProbeSettings {
    pub strategy: Strategy,
    pub reduction_factor: f64,
    pub gradient_threshold: f64,
    pub num_batches: usize,
    /// Tokens between calibration window starts (default seqlen/2).
    pub stride: Option<usize>,
    pub include_embeddings: bool,
    pub grad_precision: GradPrecision,
    pub iterative: bool,
    pub initial_sparsity: f64,
    pub sparsity_step: f64,
    pub max_ppl_increase: f64,
}

impl Default for GradProbeSettings {
    fn default() -> Self {
        Self {
            strategy: Strategy::Magnitude,
            reduction_factor: 0.1,
            gradient_threshold: 0.0,
            num_batches: 1,
            stride: None,
            include_embeddings: false,
            grad_precision: GradPrecision::F16,
            iterative: false,
            initial_sparsity: 0.1,
            sparsity_step: 0.1,
            max_ppl_increase: 3.0,
        }
    }
}

/// Everything `prune` needs (the CLI's flags, resolved once).
#[derive(Debug, Clone)]
pub struct PruneJob {
    /// Model folder or Hub id, and the Hub revision.
    pub model: String,
    pub revision: String,
    pub method: Method,
    pub sparsity: f64,
    pub pattern: Pattern,
    pub nsamples: usize,
    /// Window length (default 2048, 128 for GradProbe), capped at the
    /// model's positions.
    pub seqlen: Option<usize>,
    pub seed: u64,
    pub calib: Option<TextSource>,
    pub eval: Option<TextSource>,
    pub eval_windows: Option<usize>,
    /// Evaluate the dense model on the same windows first, inside the run
    /// (stages `00_before_dense_eval` / `00_after_dense_eval`).
    pub eval_dense: bool,
    pub use_variant: bool,
    pub save: Option<PathBuf>,
    /// How `save` is written.
    pub save_format: SaveFormat,
    pub resident: bool,
    pub dtype: ComputeDtype,
    /// Windows per forward pass (default 8; GradProbe: per gradient batch, 1).
    pub batch_size: Option<usize>,
    pub percdamp: f64,
    pub blocksize: usize,
    /// RIA: the activation exponent (0.5, the authors' default).
    pub ria_a: f64,
    /// RIA, unstructured: compare within each output row instead of one
    /// threshold per matrix (the authors' `--per_outneuron`).
    pub per_outneuron: bool,
    /// RIA, N:M: the authors' heuristic channel reallocation, and their
    /// linear-sum-assignment rounds after it (`lsa`).
    pub reallocation: bool,
    pub lsa: bool,
    /// OWL's per-layer sparsities around `sparsity` (`None`: uniform).
    pub owl: Option<crate::prune::owl::OwlConfig>,
    /// DSnoT's refinement of the method's mask (`None`: the method's own mask).
    pub dsnot: Option<crate::prune::dsnot::DsnotOptions>,
    pub gradprobe: GradProbeSettings,
    /// Run even when the estimate says it will not fit in memory.
    pub force: bool,
    /// The command line that asked for it, for the run's plan.
    pub argv: Vec<String>,
}

impl PruneJob {
    /// Wanda at 50% on `model`, with the reference scripts' defaults.
    pub fn new(model: impl Into<String>, method: Method) -> Self {
        Self {
            model: model.into(),
            revision: "main".into(),
            method,
            sparsity: 0.5,
            pattern: Pattern::Unstructured,
            nsamples: 128,
            seqlen: None,
            seed: 0,
            calib: None,
            eval: None,
            eval_windows: None,
            eval_dense: false,
            use_variant: false,
            save: None,
            save_format: SaveFormat::Dense,
            resident: false,
            dtype: ComputeDtype::F32,
            batch_size: None,
            percdamp: 0.01,
            blocksize: 128,
            ria_a: 0.5,
            per_outneuron: false,
            reallocation: false,
            lsa: false,
            owl: None,
            dsnot: None,
            gradprobe: GradProbeSettings::default(),
            force: false,
            argv: Vec::new(),
        }
    }

    /// Windows per forward pass: the setting, or the method's default.
    pub fn batch_size(&self) -> usize {
        self.batch_size
            .unwrap_or(if self.method == Method::GradProbe {
                1
            } else {
                8
            })
    }

    /// The requested window length, or the method's default.
    pub fn requested_seqlen(&self) -> Option<usize> {
        self.seqlen
            .or((self.method == Method::GradProbe).then_some(128))
    }

    /// Checks the configuration as a whole, before anything is loaded.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use Field::{
            BatchSize, Blocksize, CalibText, EvalText, EvalWindows, Nsamples, Sparsity, UseVariant,
        };
        let s = self.sparsity;
        if !(0.0..1.0).contains(&s) || s.is_nan() {
            bad(format!("{{}} must be in [0, 1), got {s}"), &[Sparsity])?;
        }
        if let Pattern::NM { n, m } = self.pattern {
            if n == 0 || m == 0 || n >= m {
                bad(format!("N:M sparsity needs 0 < N < M, got {n}:{m}"), &[])?;
            }
            let want = n as f64 / m as f64;
            if (s - want).abs() > 1e-9 {
                bad(
                    format!(
                        "{n}:{m} sparsity prunes exactly {want} of the weights; {{}} must be {want}, got {s}"
                    ),
                    &[Sparsity],
                )?;
            }
        }
        match self.method {
            Method::Wanda | Method::SparseGpt | Method::Ria if self.nsamples == 0 => {
                bad("{} must be at least 1", &[Nsamples])?
            }
            Method::GradProbe => self.validate_gradprobe()?,
            _ => {}
        }
        if self.method != Method::Magnitude && self.calib.is_none() {
            bad(
                format!("{{}} is required for {{}} {}", self.method),
                &[CalibText, Field::Method],
            )?;
        }
        if self.batch_size == Some(0) || self.blocksize == 0 {
            bad("{} and {} must be at least 1", &[BatchSize, Blocksize])?;
        }
        if self.eval_windows == Some(0) {
            bad("{} must be at least 1", &[EvalWindows])?;
        }
        if self.eval_dense && self.eval.is_none() {
            bad(
                "{} evaluates on the evaluation text: give {}",
                &[Field::EvalDense, EvalText],
            )?;
        }
        if self.eval_dense && self.gradprobe.iterative {
            bad(
                "{} already evaluates the dense model: drop {}",
                &[Field::Iterative, Field::EvalDense],
            )?;
        }
        if !(self.percdamp.is_finite() && self.percdamp >= 0.0) {
            let p = self.percdamp;
            bad(
                format!("{{}} must be 0 or more, got {p}"),
                &[Field::Percdamp],
            )?;
        }
        if self.use_variant
            && (self.method != Method::Wanda || self.pattern != Pattern::Unstructured)
        {
            bad(
                "{} applies to {} wanda with unstructured sparsity",
                &[UseVariant, Field::Method],
            )?;
        }
        if self.per_outneuron
            && (self.method != Method::Ria || self.pattern != Pattern::Unstructured)
        {
            bad(
                "{} applies to {} ria with unstructured sparsity",
                &[Field::PerOutneuron, Field::Method],
            )?;
        }
        if let Some(owl) = self.owl {
            if self.method == Method::GradProbe || self.pattern != Pattern::Unstructured {
                bad(
                    "{} sets per-layer sparsities for unstructured magnitude, wanda, sparsegpt or ria (not {} or N:M {})",
                    &[Field::Owl, Field::Method, Field::SparsityType],
                )?;
            }
            if self.calib.is_none() {
                bad(
                    "{} measures outliers on calibration text: give {}",
                    &[Field::Owl, CalibText],
                )?;
            }
            if !(owl.lambda.is_finite() && owl.lambda >= 0.0) {
                bad(
                    format!("{{}} must be 0 or more, got {}", owl.lambda),
                    &[Field::OwlLambda],
                )?;
            }
            if !(owl.m.is_finite() && owl.m > 0.0) {
                bad(
                    format!("{{}} must be more than 0, got {}", owl.m),
                    &[Field::OwlM],
                )?;
            }
        }
        self.validate_dsnot()?;
        if self.lsa && !self.reallocation {
            bad(
                "{} refines {}: give both",
                &[Field::Lsa, Field::Reallocation],
            )?;
        }
        if self.reallocation
            && (self.method != Method::Ria || !matches!(self.pattern, Pattern::NM { .. }))
        {
            bad(
                "{} permutes columns for {} ria with N:M sparsity",
                &[Field::Reallocation, Field::Method],
            )?;
        }
        if self.reallocation && self.dsnot.is_some() {
            bad(
                "{} and {} do not combine (DSnoT refines the unpermuted groups)",
                &[Field::Reallocation, Field::Dsnot],
            )?;
        }
        if self.save_format == SaveFormat::Compressed && self.save.is_none() {
            bad(
                "{} compressed writes the saved model: give {}",
                &[Field::SaveFormat, Field::Save],
            )?;
        }
        if !self.ria_a.is_finite() {
            bad(
                format!("{{}} must be a finite number, got {}", self.ria_a),
                &[Field::RiaA],
            )?;
        }
        for (field, text) in [(CalibText, &self.calib), (EvalText, &self.eval)] {
            if let Some(t) = text
                && !t.path.is_file()
            {
                bad(format!("{{}} {}: no such file", t.path.display()), &[field])?;
            }
        }
        Ok(())
    }

    /// DSnoT refines a magnitude, Wanda, SparseGPT or RIA mask with input
    /// means and variances from calibration text.
    fn validate_dsnot(&self) -> Result<(), ConfigError> {
        use Field::{CalibText, Dsnot, DsnotPowVar, DsnotThreshold, UseVariant};
        let Some(d) = self.dsnot else {
            return Ok(());
        };
        if self.method == Method::GradProbe {
            bad(
                "{} refines magnitude, wanda, sparsegpt or ria masks, not {} gradprobe",
                &[Dsnot, Field::Method],
            )?;
        }
        if self.calib.is_none() {
            bad(
                format!(
                    "{{}} needs the inputs' means and variances, which {} alone does not collect: give {{}}",
                    self.method
                ),
                &[Dsnot, CalibText],
            )?;
        }
        if self.use_variant {
            bad(
                "{} chooses its first mask per output row: drop {}",
                &[Dsnot, UseVariant],
            )?;
        }
        if !(d.update_threshold.is_finite() && d.update_threshold >= 0.0) {
            bad(
                format!("{{}} must be 0 or more, got {}", d.update_threshold),
                &[DsnotThreshold],
            )?;
        }
        if !d.pow_of_var.is_finite() {
            bad(
                format!("{{}} must be a finite number, got {}", d.pow_of_var),
                &[DsnotPowVar],
            )?;
        }
        Ok(())
    }

    /// Settings that make no sense with GradProbe, refused up front.
    fn validate_gradprobe(&self) -> Result<(), ConfigError> {
        use Field::{
            Dtype, EvalText, GradientThreshold, InitialSparsity, Iterative, MaxPplIncrease,
            NumBatches, ReductionFactor, Resident, SparsityStep, SparsityType, Stride,
        };
        let g = &self.gradprobe;
        if self.pattern != Pattern::Unstructured {
            bad(
                "GradProbe prunes unstructured sparsity only ({} unstructured)",
                &[SparsityType],
            )?;
        }
        if self.dtype != ComputeDtype::F32 {
            bad(
                "{} gradprobe computes gradients in f32: use {} f32",
                &[Field::Method, Dtype],
            )?;
        }
        if self.resident {
            bad(
                "{} gradprobe always streams layers from the checkpoint; drop {}",
                &[Field::Method, Resident],
            )?;
        }
        if g.num_batches == 0 || g.stride == Some(0) {
            bad("{} and {} must be at least 1", &[NumBatches, Stride])?;
        }
        if !(g.reduction_factor.is_finite() && g.gradient_threshold.is_finite()) {
            bad(
                "{} and {} must be finite numbers",
                &[ReductionFactor, GradientThreshold],
            )?;
        }
        if g.iterative {
            if self.eval.is_none() {
                bad(
                    "{} evaluates perplexity after each step: give {}",
                    &[Iterative, EvalText],
                )?;
            }
            let ok = |v: f64| v > 0.0 && v < 1.0;
            if !ok(g.initial_sparsity) || !ok(g.sparsity_step) {
                bad(
                    "{} and {} must be in (0, 1)",
                    &[InitialSparsity, SparsityStep],
                )?;
            }
            if g.max_ppl_increase.is_nan() || g.max_ppl_increase < 0.0 {
                bad("{} must be 0 or more", &[MaxPplIncrease])?;
            }
        }
        Ok(())
    }
}

/// Everything `eval` needs.
#[derive(Debug, Clone)]
pub struct EvalJob {
    pub model: String,
    pub revision: String,
    pub text: TextSource,
    pub seqlen: Option<usize>,
    /// Evaluate only the first K windows.
    pub windows: Option<usize>,
    pub batch_size: usize,
    pub dtype: ComputeDtype,
    pub resident: bool,
    /// Run even when the estimate says it will not fit in memory.
    pub force: bool,
    pub argv: Vec<String>,
}

impl EvalJob {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size == 0 {
            bad("{} must be at least 1", &[Field::BatchSize])?;
        }
        if self.windows == Some(0) {
            bad("{} must be at least 1", &[Field::Windows])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(method: Method) -> PruneJob {
        let mut j = PruneJob::new("m", method);
        j.calib = Some(TextSource {
            path: std::env::current_exe().unwrap(),
            lines: LineRange::All,
        });
        j
    }

    fn flag(f: Field) -> String {
        format!("--{}", f.key().replace('_', "-"))
    }

    #[test]
    fn fields_render_as_keys_or_flags() {
        let mut j = job(Method::Wanda);
        j.sparsity = 1.0;
        let e = j.validate().unwrap_err();
        assert_eq!(e.to_string(), "sparsity must be in [0, 1), got 1");
        assert_eq!(e.render(flag), "--sparsity must be in [0, 1), got 1");
        j.sparsity = 0.5;
        j.use_variant = true;
        j.pattern = "2:4".parse().unwrap();
        assert_eq!(
            j.validate().unwrap_err().render(flag),
            "--use-variant applies to --method wanda with unstructured sparsity"
        );
    }

    #[test]
    fn validation() {
        let u = Pattern::Unstructured;
        let check = |method, sparsity, pattern: Pattern, nsamples| {
            let mut j = job(method);
            (j.sparsity, j.pattern, j.nsamples) = (sparsity, pattern, nsamples);
            j.validate()
        };
        assert!(check(Method::Wanda, 0.5, u, 128).is_ok());
        assert!(check(Method::Wanda, 1.0, u, 128).is_err());
        assert!(check(Method::Wanda, -0.1, u, 128).is_err());
        assert!(check(Method::Wanda, 0.5, u, 0).is_err());
        assert!(check(Method::Magnitude, 0.5, u, 0).is_ok());
        assert!(check(Method::Wanda, 0.5, "2:4".parse().unwrap(), 8).is_ok());
        assert!(check(Method::Wanda, 0.6, "2:4".parse().unwrap(), 8).is_err());
        assert!(check(Method::Wanda, 0.5, "4:4".parse().unwrap(), 8).is_err());
        assert!(check(Method::GradProbe, 0.5, "2:4".parse().unwrap(), 8).is_err());
        let mut no_calib = job(Method::SparseGpt);
        no_calib.calib = None;
        assert_eq!(
            no_calib.validate().unwrap_err().render(flag),
            "--calib-text is required for --method sparsegpt"
        );
    }
}
