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

/// What a gauge's bar shows: one reading on a scale, or a part within a
/// whole (the pool's bytes in use within its reserve, the heap within the
/// resident set) as two fills on one scale, the whole's peak marked.
enum Fill {
    One(Reading, u64),
    Within(Reading, Reading, u64),
}

/// One gauge line before its bar's width is known: its name, its bar and
/// the figures after the bar, so the bars can share the width the longest
/// figures leave.
struct Gauge {
    name: &'static str,
    fill: Fill,
    figures: String,
    color: Color,
}

fn text(v: Option<u64>) -> String {
    v.map_or("n/a".to_string(), format_bytes)
}

fn one(name: &'static str, r: &Reading, full: u64, color: Color) -> Gauge {
    let total = r
        .total
        .map_or(String::new(), |t| format!(" of {}", format_bytes(t)));
    Gauge {
        name,
        fill: Fill::One(*r, full),
        figures: format!(" {:>10}{total}  peak {}", text(r.now), text(r.peak)),
        color,
    }
}

/// `part` within `whole` on one bar: "heap 200.0 MiB / RSS 300.0 MiB
/// peak 305.0 MiB", the peak being the whole's.
fn within(
    name: &'static str,
    [part_name, whole_name]: [&str; 2],
    [part, whole]: [&Reading; 2],
    full: u64,
    color: Color,
) -> Gauge {
    Gauge {
        name,
        fill: Fill::Within(*part, *whole, full),
        figures: format!(
            " {part_name} {} / {whole_name} {}  peak {}",
            text(part.now),
            text(whole.now),
            text(whole.peak)
        ),
        color,
    }
}

/// `part` as `█` within `whole` as `▒` on a scale of `full`, `│` at the
/// whole's peak.
fn bar_within(part: &Reading, whole: &Reading, full: u64, width: usize) -> String {
    let outer = bar(whole, full, width);
    let inner = bar(
        &Reading {
            now: part.now,
            ..Default::default()
        },
        full,
        width,
    );
    (outer.chars().zip(inner.chars()))
        .map(|(o, i)| match (o, i) {
            ('│', _) => '│',
            (_, '█') => '█',
            ('█', _) => '▒',
            _ => '░',
        })
        .collect()
}

impl Gauge {
    fn line(self, width: usize) -> Line<'static> {
        let bar = match self.fill {
            Fill::One(r, full) => bar(&r, full, width),
            Fill::Within(part, whole, full) => bar_within(&part, &whole, full, width),
        };
        Line::from(vec![
            Span::raw(format!("{:<10}", self.name)),
            Span::styled(bar, Style::new().fg(self.color)),
            Span::raw(self.figures),
        ])
    }
}

/// A device run's bus: bytes up and down and kernels launched so far, each
/// with its rate over the last second, and the phase open ("is the GPU
/// waiting on copies?"); nothing without a bus reading (the CPU backend).
/// Where the line is wider than `width`, it gives up the bytes' rates, then
/// the launches' total (their rate says more about a GPU waiting on its
/// host), then the phase (the header names the pass).
fn bus_line(run: &crate::events::fold::RunFold, width: usize) -> Option<Line<'static>> {
    let bus = run.bus.as_ref()?;
    let b = &bus.latest;
    let rates = bus.rates();
    // A first run of a build compiles as it launches: say so, since those
    // seconds are not the GPU's work and the next run will not pay them.
    let compiled = b
        .compiled
        .filter(|n| *n > 0)
        .map_or(String::new(), |n| format!(", {n} compiled"));
    let form = |byte_rates: bool, launches: bool, phase: bool| {
        let rate = |r: Option<f64>| match r {
            Some(r) if byte_rates => format!(" {}/s", format_bytes(r as u64)),
            _ => String::new(),
        };
        let traffic = format!(
            "↑ {}{}  ↓ {}{}",
            format_bytes(b.host_to_device_bytes),
            rate(rates.map(|r| r.host_to_device)),
            format_bytes(b.device_to_host_bytes),
            rate(rates.map(|r| r.device_to_host)),
        );
        let kernels = match (b.kernels, rates.and_then(|r| r.kernels)) {
            (Some(k), Some(r)) if launches => format!("{k} kernels {r:.0}/s"),
            (_, Some(r)) => format!("{r:.0} kernels/s"),
            (Some(k), None) => format!("{k} kernels"),
            (None, None) => "kernels n/a".into(),
        };
        let phase = match b.phase.as_deref() {
            Some(p) if phase => format!("  in {p}"),
            _ => String::new(),
        };
        (traffic, format!("  {kernels}{compiled}{phase}"))
    };
    let forms = [
        (true, true, true),
        (false, true, true),
        (false, false, true),
    ];
    let fits =
        |(t, rest): &(String, String)| 10 + t.chars().count() + rest.chars().count() <= width;
    let (traffic, rest) = (forms.into_iter())
        .map(|(r, l, p)| form(r, l, p))
        .find(fits)
        .unwrap_or_else(|| form(false, false, false));
    Some(Line::from(vec![
        Span::raw(format!("{:<10}", "bus")),
        Span::styled(traffic, Style::new().fg(Color::LightBlue)),
        Span::raw(rest),
    ]))
}

/// NVML's utilisation as a bar of 100%: the latest reading, the run's
/// mean and, on a device run, the open phase's ("80%  mean 50%  prune
/// 70%"), so the view says which part of the run keeps the GPU idle;
/// nothing without a reading.
fn busy_gauge(run: &crate::events::fold::RunFold) -> Option<Gauge> {
    let b = &run.gpu_busy;
    let now = b.now?;
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
    // NVML reads whole percents: the gauges' bar on a scale of 100.
    let reading = Reading {
        now: Some(now as u64),
        ..Default::default()
    };
    Some(Gauge {
        name: "GPU busy",
        fill: Fill::One(reading, 100),
        figures: format!(" {now:>9.0}%{mean}{phase}"),
        color: Color::Yellow,
    })
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
/// Both bars share one scale; a compact view keeps the peak's.
fn category_lines(state: &UiState, width: usize, compact: bool) -> Vec<Line<'static>> {
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
    let at_peak = category_bar("at peak", peak, what[1], full, width);
    match compact {
        true => vec![at_peak],
        false => vec![category_bar("by kind", now, what[0], full, width), at_peak],
    }
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

/// The gauges of the pool and the host: on a device run the pool on its
/// own scale (its reserved bytes) beside the host's resident set and heap,
/// each pair on one bar in a `compact` view; else the host's series on
/// one scale.
fn memory_gauges(run: &crate::events::fold::RunFold, compact: bool) -> Vec<Gauge> {
    match run.on_device() {
        // The device pool on its own scale (its reserved bytes), beside the
        // host's resident set and heap.
        true => {
            let host_full = run.rss.peak.max(run.heap.peak).unwrap_or(1);
            let pool_full = run.reserved.peak.max(run.device.peak).unwrap_or(1);
            match compact {
                true => vec![
                    within(
                        "host",
                        ["heap", "RSS"],
                        [&run.heap, &run.rss],
                        host_full,
                        Color::Green,
                    ),
                    within(
                        "device",
                        ["in use", "reserved"],
                        [&run.device, &run.reserved],
                        pool_full,
                        Color::Cyan,
                    ),
                ],
                false => vec![
                    one("RSS", &run.rss, host_full, Color::Green),
                    one("heap", &run.heap, host_full, Color::Blue),
                    one("device", &run.device, pool_full, Color::Cyan),
                    one("reserved", &run.reserved, pool_full, Color::Magenta),
                ],
            }
        }
        // Host series share one scale (the largest peak), so bars compare.
        false => {
            let host_full = [run.rss.peak, run.heap.peak, run.reserved.peak]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(1);
            vec![
                one("RSS", &run.rss, host_full, Color::Green),
                one("allocated", &run.heap, host_full, Color::Blue),
                one("reserved", &run.reserved, host_full, Color::Magenta),
            ]
        }
    }
}

/// The memory block's lines for an inner width of `width` cells. A
/// `compact` view (a short terminal) draws a device run's heap within its
/// resident set and the pool's bytes in use within its reserve on one bar
/// each, keeps the categories at the peak only and leaves out a GPU line
/// that has no reading, so that the utilisation, the bus and the forecast
/// still show in 24 rows.
pub(super) fn lines(state: &UiState, width: usize, compact: bool) -> Vec<Line<'static>> {
    let run = &state.run;
    let mut gauges = memory_gauges(run, compact);
    let gpu = &run.gpu;
    if !compact || gpu.now.or(gpu.peak).or(gpu.total).is_some() {
        let gpu_full = gpu.total.or(gpu.peak).unwrap_or(1);
        gauges.push(one("GPU used", gpu, gpu_full, Color::Yellow));
    }
    // How busy the card is (NVML) under how full it is: "why is my GPU
    // idle?" now, over the run and in the phase open.
    gauges.extend(busy_gauge(run));
    // The bars share the width the longest figures leave.
    let figures = gauges.iter().map(|g| g.figures.chars().count()).max();
    let bar_width = width.saturating_sub(10 + figures.unwrap_or(0)).clamp(8, 60);
    let mut lines: Vec<Line<'static>> = gauges.into_iter().map(|g| g.line(bar_width)).collect();
    lines.extend(bus_line(run, width));
    lines.extend(category_lines(state, bar_width, compact));
    lines.push(forecast_line(state));
    lines
}

pub(super) fn draw_gauges(frame: &mut Frame, area: Rect, lines: Vec<Line<'static>>) {
    let title = " memory (│ = peak) ";
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}
