//! A kernel chosen by name for the whole process: an environment variable
//! names it for a run, `set` for a measurement, and unnamed the device's
//! measured default is asked for once. The matmul strategy
//! (`exec::matmul`) and the attention kernel (`exec::attention`) are
//! chosen this way; the first name is always Burn's own path.

use std::sync::atomic::{AtomicUsize, Ordering};

/// One process-wide choice among `names`.
pub struct Named {
    /// The environment variable that names the kernel for a run.
    env: &'static str,
    /// The names, Burn's own path first.
    pub names: &'static [&'static str],
    /// What the first name means, for the warning about an unknown name.
    burns: &'static str,
    /// `usize::MAX`: not read from the environment yet.
    chosen: AtomicUsize,
}

impl Named {
    pub const fn new(
        env: &'static str,
        names: &'static [&'static str],
        burns: &'static str,
    ) -> Self {
        Self {
            env,
            names,
            burns,
            chosen: AtomicUsize::new(usize::MAX),
        }
    }

    /// Uses `name` from now on; `false` (nothing changed) for an unknown
    /// name.
    pub fn set(&self, name: &str) -> bool {
        match self.names.iter().position(|n| *n == name) {
            Some(i) => {
                self.chosen.store(i, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Unnamed again: the environment and the default are asked anew.
    #[cfg(test)]
    pub fn reset(&self) {
        self.chosen.store(usize::MAX, Ordering::Relaxed);
    }

    /// The name in use: the environment variable's, or the last
    /// [`Self::set`], else `default()` (asked once, on the first call);
    /// the first name for an unknown one (said once on stderr).
    pub fn chosen_or(&self, default: impl FnOnce() -> &'static str) -> &'static str {
        let mut i = self.chosen.load(Ordering::Relaxed);
        if i == usize::MAX {
            let name = std::env::var(self.env).unwrap_or_default();
            let unset = name.is_empty();
            let name = if unset { default().to_string() } else { name };
            i = self.names.iter().position(|n| *n == name).unwrap_or(0);
            if !unset && i == 0 && name != self.names[0] {
                eprintln!(
                    "prunemem: {}={} is not one of {}; {} is used",
                    self.env,
                    crate::input::escape(&name),
                    self.names.join(", "),
                    self.burns
                );
            }
            self.chosen.store(i, Ordering::Relaxed);
        }
        self.names[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_taken_and_unknown_ones_change_nothing() {
        static CHOICE: Named = Named::new("PRUNEMEM_TEST_NAMED", &["burns", "a", "b"], "Burn's");
        assert_eq!(CHOICE.chosen_or(|| "a"), "a");
        assert!(CHOICE.set("b"));
        assert_eq!(CHOICE.chosen_or(|| "a"), "b");
        assert!(!CHOICE.set("c"));
        assert_eq!(CHOICE.chosen_or(|| "a"), "b");
        CHOICE.reset();
        // An unknown default falls back to the first name.
        assert_eq!(CHOICE.chosen_or(|| "c"), "burns");
    }
}
