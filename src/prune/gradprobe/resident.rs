//! GradProbe's decoder layers kept on the device between its passes, where
//! the device has room for them: a streamed probe reads each layer from the
//! checkpoint, converts it to f32 and uploads it four times a step.

use crate::exec::Compute;
use crate::memory::held::Held;
use crate::memory::tag::Category;
use crate::model::llama::DecoderLayer;
use burn::prelude::Tensor;

/// A kept layer and its device bytes.
type Slot<B> = Option<(DecoderLayer<B>, Held)>;

/// The decoder layers in f32 on the device, each read from the checkpoint
/// once and reused by every pass and step, where the device has room for
/// them (`GradProbe::keep_layers_resident`). A streamed run reads each
/// layer four times a step: forward and backward, in both passes. The
/// passes never change a cached layer: their scatters make new tensors.
pub(super) struct Resident<B: Compute> {
    /// Each layer and its device bytes, held as weights.
    layers: std::cell::RefCell<Vec<Slot<B>>>,
    /// The head's table in f32, where no pass changes it.
    head: std::cell::RefCell<Option<(Tensor<B, 2>, Held)>>,
}

impl<B: Compute> Resident<B> {
    pub fn new(layers: usize) -> Self {
        Self {
            layers: std::cell::RefCell::new((0..layers).map(|_| None).collect()),
            head: std::cell::RefCell::new(None),
        }
    }

    /// Layer `i`: the cached one, or `load`'s (`bytes` on the device),
    /// cached.
    pub fn get_or_load<E>(
        &self,
        i: usize,
        bytes: u64,
        load: impl FnOnce() -> Result<DecoderLayer<B>, E>,
    ) -> Result<DecoderLayer<B>, E> {
        if let Some(Some((layer, _))) = self.layers.borrow().get(i) {
            return Ok(layer.clone());
        }
        let layer = load()?;
        if let Some(slot) = self.layers.borrow_mut().get_mut(i) {
            *slot = Some((layer.clone(), Held::new(Category::Weights, bytes)));
        }
        Ok(layer)
    }

    /// Layer `i` handed over, no longer kept (the probe is done with it):
    /// the only handle to its weights, which the caller may then write
    /// over where they are.
    pub fn take(&self, i: usize) -> Option<DecoderLayer<B>> {
        let (layer, _held) = self.layers.borrow_mut().get_mut(i)?.take()?;
        Some(layer)
    }

    /// The head's table: the cached one, or `load`'s (`bytes` on the
    /// device), cached. Only for a table no pass changes (not probed, not
    /// pruned by an earlier step).
    pub fn head_or_load<E>(
        &self,
        bytes: u64,
        load: impl FnOnce() -> Result<Tensor<B, 2>, E>,
    ) -> Result<Tensor<B, 2>, E> {
        if let Some((head, _)) = self.head.borrow().as_ref() {
            return Ok(head.clone());
        }
        let head = load()?;
        *self.head.borrow_mut() = Some((head.clone(), Held::new(Category::Weights, bytes)));
        Ok(head)
    }
}
