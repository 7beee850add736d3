//! One input group of a layer's linears (q/k/v, gate/up, o, down), pruned
//! where its weights are: metric, selection and mask on the device, SparseGPT's
//! device sweep, or each linear on the host (`super::prune_linears` picks).

use super::{
    DeviceStat, LayerTarget, factored, not_positive_definite, prune_linear, prune_on_device,
    saliency, sparsegpt_on_device,
};
use crate::exec::Compute;
use crate::memory::tag::{self, Category};
use crate::model::llama::{DecoderLayer, LinearInput};
use crate::model::save::PrunedWriter;
use crate::prune::config::{LinearReport, PruneConfig};
use crate::prune::stats::LayerStats;
use crate::prune::{LayerMethod, PruneError};
use crate::timing::{self, Work};

/// The linears that share an input (q/k/v, gate/up, o, down), pruned
/// under one configuration from that input's statistics.
pub(super) struct Group<'c, 't, B: Compute> {
    pub target: &'c LayerTarget<'t, B>,
    pub input: LinearInput,
    pub config: &'c PruneConfig,
    pub nsamples: usize,
}

impl<B: Compute> Group<'_, '_, B> {
    /// The weight's name in the checkpoint.
    fn full(&self, name: &str) -> String {
        format!("model.layers.{}.{name}.weight", self.target.index)
    }

    /// Metric, selection and mask where the weights are
    /// (`on_device::handles`): DSnoT's moments, SparseGPT's saliency (the
    /// Hessian first: the norms take what is left of the input's sums),
    /// then the norms.
    pub(super) fn on_device(
        &self,
        layer: &mut DecoderLayer<B>,
        mut stats: Option<&mut LayerStats<B>>,
        writer: Option<&mut PrunedWriter>,
    ) -> Result<Vec<LinearReport>, PruneError> {
        let (input, config, nsamples) = (self.input, self.config, self.nsamples);
        let moments = match config.dsnot {
            Some(_) => stats
                .as_deref_mut()
                .and_then(|s| s.finish_moments(input, nsamples)),
            None => None,
        };
        let saliency = match config.method {
            LayerMethod::SparseGpt => {
                let first = self.full(input.linears()[0]);
                let _stats = tag::tag(Category::Statistics);
                let _factor = timing::work(Work::Sweep);
                Some(saliency(
                    stats.as_deref_mut(),
                    input,
                    nsamples,
                    config,
                    &first,
                )?)
            }
            _ => None,
        };
        let norms = stats.and_then(|s| s.finish_norms(input, nsamples));
        let stat = DeviceStat {
            norms: norms.as_ref(),
            moments: moments.as_ref(),
            saliency: saliency.as_ref(),
        };
        self.each_linear(writer, Release::EachLinear, |name, full, w| {
            prune_on_device(layer, name, full, &stat, config, w, self.target.ckpt)
        })
    }

    /// SparseGPT's sweep on the device, one factorisation per input (q/k/v
    /// and gate/up share theirs).
    pub(super) fn sparsegpt_on_device(
        &self,
        layer: &mut DecoderLayer<B>,
        stats: Option<&mut LayerStats<B>>,
        writer: Option<&mut PrunedWriter>,
    ) -> Result<Vec<LinearReport>, PruneError> {
        let first = self.full(self.input.linears()[0]);
        let hinv = {
            let _stats = tag::tag(Category::Statistics);
            let _sweep = timing::work(Work::Sweep);
            factored(stats, self.input, self.nsamples, self.config)
                .ok_or_else(|| {
                    PruneError::Invalid(format!("{first}: no statistics were collected"))
                })?
                .map_err(|e| not_positive_definite(&first, e))?
        };
        self.each_linear(writer, Release::EachLinear, |name, full, w| {
            sparsegpt_on_device(layer, name, full, &hinv, self.config, w, self.target.ckpt)
        })
    }

    /// Each linear on the host: the input's statistic finished once.
    pub(super) fn on_host(
        &self,
        layer: &mut DecoderLayer<B>,
        stats: Option<&mut LayerStats<B>>,
        writer: Option<&mut PrunedWriter>,
    ) -> Result<Vec<LinearReport>, PruneError> {
        let stat = stats.and_then(|s| s.finish(self.input, self.nsamples));
        self.each_linear(writer, Release::None, |name, full, w| {
            let stat = stat.as_ref();
            prune_linear(
                layer,
                name,
                full,
                stat,
                self.config,
                self.target.device,
                w,
                self.target.ckpt,
            )
        })
    }

    /// Each of the group's linears through `prune`, with its checkpoint name
    /// and the writer.
    fn each_linear(
        &self,
        mut writer: Option<&mut PrunedWriter>,
        release: Release,
        mut prune: impl FnMut(&str, &str, Option<&mut PrunedWriter>) -> Result<LinearReport, PruneError>,
    ) -> Result<Vec<LinearReport>, PruneError> {
        let mut reports = Vec::with_capacity(self.input.linears().len());
        for name in self.input.linears() {
            let full = self.full(name);
            reports.push(prune(name, &full, writer.as_deref_mut())?);
            if release == Release::EachLinear {
                crate::exec::release_free::<B>(self.target.device);
            }
        }
        Ok(reports)
    }
}

/// Whether the device pool's free pages go back after each linear: where
/// the selection runs on the device each linear's has its own shapes, and
/// what it freed goes back before the next one allocates (`exec::cube`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Release {
    EachLinear,
    None,
}
