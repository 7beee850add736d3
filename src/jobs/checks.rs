//! Checking a prune job before anything is loaded: each setting alone and
//! the combinations that make no sense, as [`ConfigError`]s naming fields.

use super::config::{ConfigError, Field, PruneJob, SaveFormat, bad};
use crate::model::ComputeDtype;
use crate::prune::{Method, Pattern};

impl PruneJob {
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
        // Each calibration window is drawn and kept: past 2^24 of them no
        // machine holds the inputs, and the count would size allocations.
        if self.nsamples > 1 << 24 {
            let n = self.nsamples;
            bad(
                format!("{{}} {n} is past any calibration (at most 16777216)"),
                &[Nsamples],
            )?;
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
        self.validate_options()?;
        for (field, text) in [(CalibText, &self.calib), (EvalText, &self.eval)] {
            // One rule for every input (`crate::input`): a regular file,
            // or `-` for standard input; a FIFO or a device is named.
            if let Some(t) = text
                && t.path.as_os_str() != "-"
                && let Err(e) = crate::input::check(&t.path)
            {
                bad(format!("{{}} {e}"), &[field])?;
            }
        }
        Ok(())
    }

    /// Method options beyond the defaults: RIA's, OWL's, DSnoT's, the save
    /// format.
    fn validate_options(&self) -> Result<(), ConfigError> {
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
                    &[Field::Owl, Field::CalibText],
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
