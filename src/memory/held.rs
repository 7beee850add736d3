//! Where a device pool went, by category. cubecl's pool reports bytes in
//! use and nothing about what they are; the host heap's categories come
//! from its allocator ([`super::tag`]), which sees every block, but the
//! pool's allocations happen inside cubecl, where no hook reaches.
//!
//! So a device run's composition is measured in two parts that sum to the
//! pool's bytes in use exactly:
//! - **held**: what the engine keeps on the device across operations
//!   (calibration hidden states, the layer being pruned, its statistics,
//!   rotary tables…), registered with a [`Held`] guard that lives exactly
//!   as long as the tensors it names and counts their bytes (shape × dtype);
//! - **the rest** of the pool's reading (the intermediates of the operation
//!   in progress, pool alignment): charged to the category the engine is
//!   working in when the reading is taken ([`super::tag::current`]), the
//!   same scoped tags that charge host allocations.
//!
//! The ledger is process-wide like the tags: a device run computes on one
//! thread, and only device runs read it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::tag::{CATEGORIES, Category};

/// Bytes held on the device, one slot per category in [`CATEGORIES`] order.
pub type Parts = [u64; CATEGORIES.len()];

static HELD: [AtomicU64; CATEGORIES.len()] = [const { AtomicU64::new(0) }; CATEGORIES.len()];

fn slot(category: Category) -> usize {
    CATEGORIES
        .iter()
        .position(|c| *c == category)
        .unwrap_or(CATEGORIES.len() - 1)
}

/// Device bytes the engine holds for one purpose, counted in the ledger
/// until dropped. Keep it beside the tensors it counts.
#[derive(Debug)]
#[must_use = "the bytes are held as long as the guard"]
pub struct Held {
    category: Category,
    bytes: u64,
}

impl Held {
    /// Holds `bytes` under `category`.
    pub fn new(category: Category, bytes: u64) -> Self {
        HELD[slot(category)].fetch_add(bytes, Ordering::Relaxed);
        Self { category, bytes }
    }

    /// Nothing held yet (grown with [`Held::set`]).
    pub fn none(category: Category) -> Self {
        Self::new(category, 0)
    }

    /// Changes the bytes held (a buffer that grew or shrank).
    pub fn set(&mut self, bytes: u64) {
        let s = &HELD[slot(self.category)];
        s.fetch_add(bytes, Ordering::Relaxed);
        s.fetch_sub(self.bytes, Ordering::Relaxed);
        self.bytes = bytes;
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD[slot(self.category)].fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Bytes of a tensor's elements in its dtype.
pub fn tensor_bytes<B: burn::prelude::Backend, const D: usize>(
    t: &burn::prelude::Tensor<B, D>,
) -> u64 {
    (t.shape().num_elements() * t.dtype().size()) as u64
}

/// What `in_use` pool bytes are made of now: the held bytes by category
/// (as much of them as the reading covers, in display order), and the rest
/// charged to the current tag. Sums to `in_use`.
pub fn composition(in_use: u64) -> Parts {
    split(
        std::array::from_fn(|i| HELD[i].load(Ordering::Relaxed)),
        in_use,
        super::tag::current(),
    )
}

fn split(held: Parts, in_use: u64, current: Category) -> Parts {
    let mut parts = [0; CATEGORIES.len()];
    let mut left = in_use;
    for (p, h) in parts.iter_mut().zip(held) {
        *p = h.min(left);
        left -= *p;
    }
    parts[slot(current)] += left;
    parts
}

/// Parts as named categories, without the empty ones.
pub fn named(parts: &Parts) -> std::collections::BTreeMap<String, u64> {
    CATEGORIES
        .iter()
        .zip(parts)
        .filter(|(_, b)| **b > 0)
        .map(|(c, b)| (c.name().to_string(), *b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(parts: &Parts, c: Category) -> u64 {
        parts[slot(c)]
    }

    #[test]
    fn the_rest_of_the_reading_goes_to_the_current_tag() {
        let mut held = [0; CATEGORIES.len()];
        held[slot(Category::Weights)] = 100;
        held[slot(Category::Activations)] = 50;
        let p = split(held, 400, Category::Statistics);
        assert_eq!(at(&p, Category::Weights), 100);
        assert_eq!(at(&p, Category::Activations), 50);
        assert_eq!(at(&p, Category::Statistics), 250);
        assert_eq!(p.iter().sum::<u64>(), 400);
        // The current tag may also hold: its transient adds to it.
        let p = split(held, 400, Category::Activations);
        assert_eq!(at(&p, Category::Activations), 300);
    }

    #[test]
    fn a_reading_below_what_is_held_still_sums_to_the_reading() {
        let mut held = [0; CATEGORIES.len()];
        held[slot(Category::Weights)] = 100;
        held[slot(Category::Activations)] = 50;
        let p = split(held, 120, Category::Logits);
        assert_eq!(
            (at(&p, Category::Weights), at(&p, Category::Activations)),
            (100, 20)
        );
        assert_eq!(p.iter().sum::<u64>(), 120);
    }

    #[test]
    fn guards_count_while_they_live() {
        // Nothing else holds tokenizer bytes on a device.
        let now = || HELD[slot(Category::Tokenizer)].load(Ordering::Relaxed);
        let mut a = Held::new(Category::Tokenizer, 7);
        let b = Held::new(Category::Tokenizer, 5);
        a.set(10);
        assert_eq!(now(), 15);
        drop(b);
        drop(a);
        assert_eq!(now(), 0);
    }
}
