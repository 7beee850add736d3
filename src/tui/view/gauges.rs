//! The memory block of the live view: one gauge per reading with its peak
//! marked, the heap by category now and at its peak (one scale, the
//! categories' shared colours), and the fit forecast against the budget.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use super::super::state::UiState;
use crate::events::fold::Reading;
use crate::units::format_bytes;

/// A bar of `width` cells for `r` on a scale of `full` bytes, with `│` at
/// the peak.
pub fn bar(r: &Reading, full: u64, width: usize) -> String {
    let cells = |v: u64| ((v as f64 / full.max(1) as f64) * width as f64).round() as usize;
    let filled = r.now.map_or(0, cells).min(width);
    let peak = r.peak.map(|p| cells(p).clamp(1, width) - 1);
    (0..width)
        .map(|i| match (i < filled, peak == Some(i)) {
            (_, true) => '│',
            (true, false) => '█',
            (false, false) => '░',
        })
        .collect()
}

fn gauge_line<'a>(name: &'a str, r: &Reading, full: u64, width: usize, color: Color) -> Line<'a> {
    let text = |v: Option<u64>| v.map_or("n/a".to_string(), format_bytes);
    let total = r
        .total
        .map_or(String::new(), |t| format!(" of {}", format_bytes(t)));
    Line::from(vec![
        Span::raw(format!("{name:<10}")),
        Span::styled(bar(r, full, width), Style::new().fg(color)),
        Span::raw(format!(
            " {:>10}{total}  peak {}",
            text(r.now),
            text(r.peak)
        )),
    ])
}

/// A device run's bus: bytes up and down and kernels launched so far, each
/// with its rate over the last second, and the phase open ("is the GPU
/// waiting on copies?"); nothing without a bus reading (the CPU backend).
fn bus_line(run: &crate::events::fold::RunFold) -> Option<Line<'static>> {
    let bus = run.bus.as_ref()?;
    let b = &bus.latest;
    let rates = bus.rates();
    let rate =
        |r: Option<f64>| r.map_or(String::new(), |r| format!(" {}/s", format_bytes(r as u64)));
    let kernels = match (b.kernels, rates.and_then(|r| r.kernels)) {
        (Some(k), Some(r)) => format!("{k} kernels {r:.0}/s"),
        (Some(k), None) => format!("{k} kernels"),
        (None, _) => "kernels n/a".into(),
    };
    // A first run of a build compiles as it launches: say so, since those
    // seconds are not the GPU's work and the next run will not pay them.
    let compiled = b
        .compiled
        .filter(|n| *n > 0)
        .map_or(String::new(), |n| format!(", {n} compiled"));
    let phase = b
        .phase
        .as_deref()
        .map_or(String::new(), |p| format!("  in {p}"));
    Some(Line::from(vec![
        Span::raw(format!("{:<10}", "bus")),
        Span::styled(
            format!(
                "↑ {}{}  ↓ {}{}",
                format_bytes(b.host_to_device_bytes),
                rate(rates.map(|r| r.host_to_device)),
                format_bytes(b.device_to_host_bytes),
                rate(rates.map(|r| r.device_to_host)),
            ),
            Style::new().fg(Color::LightBlue),
        ),
        Span::raw(format!("  {kernels}{compiled}{phase}")),
    ]))
}

/// NVML's utilisation as a bar of 100%: the latest reading, the run's
/// mean and, on a device run, the open phase's ("80%  mean 50%  prune
/// 70%"), so the view says which part of the run keeps the GPU idle;
/// nothing without a reading.
fn busy_line(run: &crate::events::fold::RunFold, width: usize) -> Option<Line<'static>> {
    let b = &run.gpu_busy;
    let now = b.now?;
    // NVML reads whole percents: the gauges' bar on a scale of 100.
    let reading = Reading {
        now: Some(now as u64),
        ..Default::default()
    };
    let bar = bar(&reading, 100, width);
    let mean = b
        .run
        .percent()
        .map_or(String::new(), |m| format!("  mean {m:.0}%"));
    let phase = run
        .bus
        .as_ref()
        .and_then(|bus| bus.latest.phase.as_deref())
        .and_then(|p| Some(format!("  {p} {:.0}%", b.in_phase(p)?)))
        .unwrap_or_default();
    Some(Line::from(vec![
        Span::raw(format!("{:<10}", "GPU busy")),
        Span::styled(bar, Style::new().fg(Color::Yellow)),
        Span::raw(format!(" {now:>9.0}%{mean}{phase}")),
    ]))
}

/// A heap category's colour, the same as in the report's charts.
pub fn category_color(name: &str) -> Color {
    let (r, g, b) = crate::memory::tag::color(name);
    Color::Rgb(r, g, b)
}

/// The memory the run computes in, split by category as stacked bars:
/// now, and at its peak so far (the highest stage window's composition
/// while the run goes, the run's own figure once it has finished). On a
/// device run that is the device pool (`memory::held`), else the heap.
/// Both bars share one scale.
fn category_lines(state: &UiState, width: usize) -> [Line<'static>; 2] {
    let none = Default::default();
    let run = &state.run;
    let (now, peak, what) = match run.device_peak_composition() {
        Some(peak) => (&run.device_categories, peak, ["device now", "device peak"]),
        None => (
            &run.categories,
            run.heap_peak_composition().unwrap_or(&none),
            ["heap now", "heap peak"],
        ),
    };
    let full = now.values().sum::<u64>().max(peak.values().sum::<u64>());
    [
        category_bar("by kind", now, what[0], full, width),
        category_bar("at peak", peak, what[1], full, width),
    ]
}

fn category_bar(
    label: &str,
    cats: &std::collections::BTreeMap<String, u64>,
    what: &str,
    full: u64,
    width: usize,
) -> Line<'static> {
    let total: u64 = cats.values().sum();
    if total == 0 || full == 0 {
        return Line::from(format!("{label:<10}n/a"));
    }
    let mut parts: Vec<(&String, &u64)> = cats.iter().collect();
    parts.sort_by_key(|(_, v)| std::cmp::Reverse(**v));
    let mut spans = vec![Span::raw(format!("{label:<10}"))];
    let mut used = 0;
    for (name, bytes) in &parts {
        let n = ((**bytes as u128 * width as u128) / full as u128) as usize;
        let n = n.min(width - used);
        used += n;
        spans.push(Span::styled(
            "█".repeat(n),
            Style::new().fg(category_color(name)),
        ));
    }
    spans.push(Span::raw(" ".repeat(width - used)));
    spans.push(Span::raw(format!(" {what} {}: ", format_bytes(total))));
    for (k, (name, v)) in parts.iter().take(4).enumerate() {
        let sep = if k == 0 { "" } else { " · " };
        spans.push(Span::raw(sep.to_string()));
        spans.push(Span::styled(
            format!("{name} {}", format_bytes(**v)),
            Style::new().fg(category_color(name)),
        ));
    }
    Line::from(spans)
}

/// The fit forecast: the estimated peak corrected by what was measured, and
/// whether it fits the budget; green fits, yellow will exceed, red exceeded.
fn forecast_line(state: &UiState) -> Line<'static> {
    let mut spans = vec![Span::raw(format!("{:<10}", "forecast"))];
    let Some(f) = state.forecast() else {
        spans.push(Span::raw("n/a (no estimate for this plan)"));
        return Line::from(spans);
    };
    // The verdict first: it is what a narrow terminal must still show.
    if let (Some(b), Some(v)) = (&f.budget, f.verdict()) {
        let budget = format!("{} {}", b.source, format_bytes(b.bytes));
        let (text, color) = match (&f.exceeds_at, v) {
            (Some((phase, bytes)), "exceeded") => (
                format!("EXCEEDED {budget} in {phase} ({})", format_bytes(*bytes)),
                Color::Red,
            ),
            (Some((phase, _)), _) => (format!("will exceed {budget} at {phase}"), Color::Yellow),
            (None, _) => (format!("fits {budget}"), Color::Green),
        };
        spans.push(Span::styled(text, Style::new().fg(color)));
        spans.push(Span::raw(" · "));
    }
    spans.push(Span::raw(format!(
        "peak ≈ {} in {} (estimate {})",
        format_bytes(f.peak),
        f.peak_phase,
        format_bytes(f.predicted_peak)
    )));
    if let Some(p) = state.phase_now() {
        let now: Vec<String> = p
            .by_category()
            .iter()
            .take(3)
            .map(|(c, b)| format!("{} {}", c.name(), format_bytes(*b)))
            .collect();
        spans.push(Span::raw(format!(
            " · {} predicted: {}",
            p.name,
            now.join(", ")
        )));
    }
    Line::from(spans)
}

pub(super) fn draw_gauges(frame: &mut Frame, area: Rect, state: &UiState) {
    // Host series share one scale (the largest peak), so bars compare.
    let host_full = [
        state.run.rss.peak,
        state.run.heap.peak,
        state.run.reserved.peak,
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(1);
    let width = (area.width as usize).saturating_sub(48).clamp(10, 60);
    let gpu_full = state.run.gpu.total.or(state.run.gpu.peak).unwrap_or(1);
    let run = &state.run;
    let mut lines = match run.on_device() {
        // The device pool on its own scale (its reserved bytes), beside the
        // host's resident set and heap.
        true => {
            let host_full = run.rss.peak.max(run.heap.peak).unwrap_or(1);
            let pool_full = run.reserved.peak.max(run.device.peak).unwrap_or(1);
            vec![
                gauge_line("RSS", &run.rss, host_full, width, Color::Green),
                gauge_line("heap", &run.heap, host_full, width, Color::Blue),
                gauge_line("device", &run.device, pool_full, width, Color::Cyan),
                gauge_line("reserved", &run.reserved, pool_full, width, Color::Magenta),
            ]
        }
        false => vec![
            gauge_line("RSS", &run.rss, host_full, width, Color::Green),
            gauge_line("allocated", &run.heap, host_full, width, Color::Blue),
            gauge_line("reserved", &run.reserved, host_full, width, Color::Magenta),
        ],
    };
    lines.push(gauge_line(
        "GPU used",
        &run.gpu,
        gpu_full,
        width,
        Color::Yellow,
    ));
    // How busy the card is (NVML) under how full it is: "why is my GPU
    // idle?" now, over the run and in the phase open.
    lines.extend(busy_line(run, width));
    lines.extend(bus_line(run));
    lines.extend(category_lines(state, width));
    lines.push(forecast_line(state));
    let title = " memory (│ = peak) ";
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}
