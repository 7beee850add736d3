//! A device's high-water mark, seen inside a pass. cubecl keeps no peak of
//! its own and a pass frees its intermediates before it returns, so a
//! reading taken between passes misses the forward's largest moment (the
//! MLP's gate and up projections beside the residual stream). Device
//! backends call [`after_op`] right after an operation allocated its output,
//! while its inputs are still alive; whoever measures (the profiler, through
//! its job) installs the hook on the computing thread.
//!
//! The hook is per thread because cubecl's pools are: a reading from any
//! other thread would see another stream's pool.

use std::cell::RefCell;
use std::rc::Rc;

thread_local! {
    static HOOK: RefCell<Option<Rc<dyn Fn()>>> = const { RefCell::new(None) };
}

/// Removes the hook when dropped, restoring the one it replaced.
pub struct WatchGuard {
    previous: Option<Rc<dyn Fn()>>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        HOOK.with(|h| *h.borrow_mut() = previous);
    }
}

/// Calls `hook` after every device operation on this thread until the guard
/// drops.
pub fn install(hook: impl Fn() + 'static) -> WatchGuard {
    let hook: Rc<dyn Fn()> = Rc::new(hook);
    let previous = HOOK.with(|h| h.borrow_mut().replace(hook));
    WatchGuard { previous }
}

/// Tells the hook, if any, that an operation's output now exists beside
/// its inputs.
pub fn after_op() {
    // Cloned out first: the hook may itself run device code.
    let hook = HOOK.with(|h| h.borrow().clone());
    if let Some(hook) = hook {
        hook();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn the_hook_runs_until_its_guard_drops_and_the_previous_one_returns() {
        let outer = Rc::new(Cell::new(0));
        let inner = Rc::new(Cell::new(0));
        let o = outer.clone();
        let g1 = install(move || o.set(o.get() + 1));
        after_op();
        {
            let i = inner.clone();
            let _g2 = install(move || i.set(i.get() + 1));
            after_op();
            after_op();
        }
        after_op();
        drop(g1);
        after_op();
        assert_eq!((outer.get(), inner.get()), (2, 2));
    }

    #[test]
    fn another_thread_does_not_see_this_threads_hook() {
        let _g = install(|| panic!("called from the wrong thread"));
        std::thread::spawn(after_op).join().unwrap();
    }
}
