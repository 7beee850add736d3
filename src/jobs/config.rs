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

pub(super) fn bad(text: impl Into<String>, fields: &[Field]) -> Result<(), ConfigError> {
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
    /// `save` may be a folder prunemem did not write (`model::owned`).
    pub overwrite: bool,
    pub resident: bool,
    /// Keep the calibration activations in host memory between layers.
    pub offload_activations: bool,
    /// Where a device run's pruned layers wait for the evaluation
    /// (`None`: chosen from the predicted peak and the budgets).
    pub keep_pruned: Option<crate::model::kept::Place>,
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
            overwrite: false,
            resident: false,
            offload_activations: false,
            keep_pruned: None,
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
