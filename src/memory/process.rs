//! Process and system memory as the operating system sees it.
//!
//! Resident set size, CPU share and system totals come from `sysinfo`; the
//! resident peak comes from the kernel's `VmHWM` in `/proc/<pid>/status`,
//! which can be restarted by writing `5` to `/proc/self/clear_refs` so that
//! scoped peaks are exact rather than sampled.

use std::collections::HashMap;
use std::sync::Mutex;

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, RefreshKind, System};

/// One reading of a process and its host.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessReading {
    pub rss: Option<u64>,
    pub cpu_percent: Option<f32>,
    pub system_total: Option<u64>,
    pub system_used: Option<u64>,
}

/// Reads this process (or another one) through a long-lived `sysinfo` handle,
/// so that CPU shares have a previous reading to be measured against.
pub struct ProcessProbe {
    system: Mutex<ProbeState>,
    pid: Option<Pid>,
}

struct ProbeState {
    system: System,
    /// Previous (time, CPU ticks) of the process, for the CPU share.
    last_cpu: Option<(std::time::Instant, u64)>,
}

impl ProcessProbe {
    /// A probe of the calling process.
    pub fn current() -> Self {
        Self::for_pid(sysinfo::get_current_pid().ok())
    }

    /// A probe of process `pid`.
    pub fn for_pid(pid: Option<Pid>) -> Self {
        let system = System::new_with_specifics(RefreshKind::nothing());
        Self {
            system: Mutex::new(ProbeState {
                system,
                last_cpu: None,
            }),
            pid,
        }
    }

    /// Reads RSS, CPU share and system memory. The first CPU share is `None`:
    /// a share needs two readings.
    pub fn read(&self) -> ProcessReading {
        let Ok(mut state) = self.system.lock() else {
            return ProcessReading::default();
        };
        let mut reading = ProcessReading::default();
        state.system.refresh_memory();
        let total = state.system.total_memory();
        if total > 0 {
            reading.system_total = Some(total);
            reading.system_used = Some(state.system.used_memory());
        }
        if let Some(pid) = self.pid {
            state.system.refresh_processes_specifics(
                ProcessesToUpdate::Some(&[pid]),
                true,
                ProcessRefreshKind::nothing().with_memory(),
            );
            // An exited process not yet reaped (a zombie) reads 0: that is
            // no reading, not an empty process.
            if let Some(process) = state.system.process(pid).filter(|p| is_live(p)) {
                reading.rss = Some(process.memory());
            }
            let now = std::time::Instant::now();
            if let Some(ticks) = cpu_ticks(pid.as_u32()) {
                // Clock ticks are 10 ms: over a shorter span the share is
                // noise (often 0.0), so it is unknown, and the span keeps
                // growing until the next reading.
                let span = state
                    .last_cpu
                    .map(|(then, before)| (now.duration_since(then).as_secs_f64(), before));
                match span {
                    Some((wall, _)) if wall < MIN_CPU_SPAN_S => {}
                    Some((wall, before)) => {
                        if ticks >= before {
                            let cpu = (ticks - before) as f64 / clock_ticks_per_second();
                            reading.cpu_percent = Some((100.0 * cpu / wall) as f32);
                        }
                        state.last_cpu = Some((now, ticks));
                    }
                    None => state.last_cpu = Some((now, ticks)),
                }
            }
        }
        reading
    }
}

/// The shortest span a CPU share is computed over.
const MIN_CPU_SPAN_S: f64 = 0.05;

/// User + system CPU time of a process in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&text)
}

/// utime + stime: fields 14 and 15, counted after the parenthesised name
/// (which may itself contain spaces).
fn parse_stat_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Memory a new allocation can still get: the system's available memory,
/// or what is left under this process's cgroup limit when that is lower.
pub fn available_memory() -> Option<u64> {
    let mut sys = System::new_with_specifics(RefreshKind::nothing());
    sys.refresh_memory();
    let available = Some(sys.available_memory()).filter(|a| *a > 0);
    let cgroup = sys
        .cgroup_limits()
        .and_then(|c| cgroup_room(sys.total_memory(), c.total_memory, c.rss));
    [available, cgroup].into_iter().flatten().min()
}

/// Room under a cgroup limit: `None` when the limit is no lower than the
/// machine's memory (no limit set), else the limit less the group's
/// anonymous memory. sysinfo's `free_memory` subtracts the group's whole
/// usage, page cache included; with no limit set that reported 1.4 GiB
/// "free" on a 24 GiB machine whose cache was full, and refused runs. The
/// kernel reclaims cache before it runs out, so cache is not counted.
fn cgroup_room(machine: u64, limit: u64, anon: u64) -> Option<u64> {
    (limit < machine).then(|| limit.saturating_sub(anon))
}

/// Resident set size of this process from `/proc/self/status` (`VmRSS`).
pub fn rss_now() -> Option<u64> {
    status_field("VmRSS:")
}

/// Resident high-water mark since start or the last [`reset_rss_peak`]
/// (`VmHWM`).
pub fn rss_peak_since_reset() -> Option<u64> {
    status_field("VmHWM:")
}

/// Restarts the kernel's resident high-water mark. Returns false where the
/// kernel refuses (no `/proc`, or a sandbox without write access).
pub fn reset_rss_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", b"5").is_ok()
}

fn status_field(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_kib(&text, key)
}

fn parse_status_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

/// Whether `p` is running: not a zombie, and with pages to count.
fn is_live(p: &sysinfo::Process) -> bool {
    p.status() != sysinfo::ProcessStatus::Zombie && p.memory() > 0
}

/// Resident memory of a process and all its descendants, as `watch` needs for
/// a Python script that forks workers.
pub struct TreeProbe {
    system: System,
    root: Pid,
}

impl TreeProbe {
    pub fn new(root_pid: u32) -> Self {
        Self {
            system: System::new_with_specifics(RefreshKind::nothing()),
            root: Pid::from_u32(root_pid),
        }
    }

    /// Sum of RSS over the tree, and the pids it covered; `None` once the root
    /// has exited.
    pub fn read(&mut self) -> Option<(u64, Vec<u32>)> {
        self.system.refresh_processes_specifics(
            ProcessesToUpdate::All,
            true,
            ProcessRefreshKind::nothing().with_memory(),
        );
        self.system.process(self.root).filter(|p| is_live(p))?;
        let mut children: HashMap<Pid, Vec<Pid>> = HashMap::new();
        for (pid, process) in self.system.processes() {
            if let Some(parent) = process.parent() {
                children.entry(parent).or_default().push(*pid);
            }
        }
        let mut total = 0u64;
        let mut pids = Vec::new();
        let mut stack = vec![self.root];
        while let Some(pid) = stack.pop() {
            if let Some(process) = self.system.process(pid) {
                // Threads show up as processes on Linux; count each task group once.
                if process.thread_kind().is_none() {
                    total += process.memory();
                    pids.push(pid.as_u32());
                }
            }
            if let Some(kids) = children.get(&pid) {
                stack.extend(kids.iter().copied());
            }
        }
        Some((total, pids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_room_ignores_page_cache_and_absent_limits() {
        const GIB: u64 = 1 << 30;
        // No limit (the limit is the machine's memory): no cgroup reading.
        assert_eq!(cgroup_room(24 * GIB, 24 * GIB, 2 * GIB), None);
        // A real limit: the limit less anonymous memory.
        assert_eq!(cgroup_room(24 * GIB, 8 * GIB, 3 * GIB), Some(5 * GIB));
        assert_eq!(cgroup_room(24 * GIB, 8 * GIB, 9 * GIB), Some(0));
    }

    #[test]
    fn an_exited_unreaped_process_has_no_rss_reading() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = Pid::from_u32(child.id());
        // Exited, not yet waited for: a zombie, whose RSS reads 0.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(ProcessProbe::for_pid(Some(pid)).read().rss, None);
        assert!(TreeProbe::new(child.id()).read().is_none());
        child.wait().unwrap();
    }

    #[test]
    fn parses_kib_fields() {
        let text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_status_kib(text, "VmRSS:"), Some(1024 * 1024));
        assert_eq!(parse_status_kib(text, "VmHWM:"), Some(2048 * 1024));
        assert_eq!(parse_status_kib(text, "VmSwap:"), None);
    }

    #[test]
    fn parses_stat_ticks_after_odd_names() {
        let line = "1234 (my prog) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(parse_stat_ticks(line), Some(300));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_own_rss() {
        let rss = rss_now().expect("linux has /proc/self/status");
        assert!(rss > 0);
        let probe = ProcessProbe::current();
        let first = probe.read();
        assert!(first.rss.unwrap_or(0) > 0);
        assert!(first.cpu_percent.is_none(), "first share has no baseline");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 200 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let busy = probe
            .read()
            .cpu_percent
            .expect("second reading has a share");
        assert!(busy > 30.0, "a busy loop shows CPU use: {busy}% ({x})");
        assert!(first.system_total.unwrap_or(0) >= first.rss.unwrap_or(0));
    }
}
