//! Draws a [`UiState`] into a ratatui frame: header, gauges with peak
//! markers, the history chart with stage boundaries, the stage table with the
//! peak row highlighted, layer progress, messages and the key line. Pure
//! drawing: no state changes, no terminal access, so it is tested with
//! ratatui's `TestBackend`. Bytes become text only here, in binary units.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Cell, Chart, Clear, Dataset, Gauge, GraphType, Paragraph, Row, Table, Wrap,
};

use super::state::{Focus, Mode, UiState};
use crate::events::{Level, RunStatus};
use crate::units::format_bytes;

/// Width of the stage table (its columns fit `format_bytes` output).
const STAGE_TABLE_WIDTH: u16 = 70;

/// Smallest terminal the layout is drawn in.
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, state: &UiState) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "terminal too small: {}×{}, prunemem needs at least {MIN_WIDTH}×{MIN_HEIGHT} (q quits)",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
        return;
    }
    // A short terminal (the usual 80×24 among them) gets the compact
    // memory block, and the stage table gives up rows before it does.
    let compact = area.height < 32;
    let message_rows = if compact { 3 } else { 6 };
    let gauge_lines = gauges::lines(state, area.width.saturating_sub(2) as usize, compact);
    let gauge_rows = gauge_lines.len() as u16 + 2;
    let [header, gauges, middle, progress, messages, keys] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Length(gauge_rows),
        Constraint::Min(if compact { 4 } else { 7 }),
        Constraint::Length(3),
        Constraint::Length(message_rows),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(frame, header, state);
    gauges::draw_gauges(frame, gauges, gauge_lines);
    if middle.width >= STAGE_TABLE_WIDTH + 30 {
        let [chart, table] =
            Layout::horizontal([Constraint::Min(30), Constraint::Length(STAGE_TABLE_WIDTH)])
                .areas(middle);
        draw_chart(frame, chart, state);
        draw_stages(frame, table, state);
    } else {
        // Narrow terminals: the timeline table matters most.
        draw_stages(frame, middle, state);
    }
    draw_progress(frame, progress, state);
    draw_messages(frame, messages, state);
    draw_keys(frame, keys, state);
    if state.help {
        draw_help(frame, area);
    }
    if state.confirm_quit {
        draw_confirm(frame, area, state);
    }
}

fn clock(s: f64) -> String {
    let s = s.max(0.0) as u64;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn status_text(state: &UiState) -> (String, Color) {
    match &state.finished {
        None if state.paused => ("paused (p resumes)".into(), Color::Yellow),
        None => ("running".into(), Color::Green),
        Some(RunStatus::Ok) => ("finished".into(), Color::Cyan),
        Some(RunStatus::Interrupted) => ("interrupted".into(), Color::Red),
        Some(RunStatus::Failed(e)) => (format!("failed: {e}"), Color::Red),
        Some(RunStatus::Oom(e)) => (format!("out of memory: {e}"), Color::Red),
    }
}

/// What a progress unit's name says the pass is.
fn pass_name(p: &crate::events::fold::Progress) -> &str {
    if !p.pass.is_empty() {
        return &p.pass;
    }
    // Logs written before progress events named their pass.
    let unit = p.name.as_str();
    if unit.starts_with("eval logits") {
        "logits"
    } else if unit.starts_with("eval") {
        "evaluation"
    } else if unit.starts_with("epoch") {
        "training"
    } else if unit.starts_with("OWL") {
        "OWL outliers"
    } else if unit.starts_with("model.layers") {
        "pruning"
    } else {
        // GradProbe's forward and backward layers, head and embeddings.
        "gradient pass"
    }
}

fn draw_header(frame: &mut Frame, area: Rect, state: &UiState) {
    let (status, color) = status_text(state);
    // The ETA is the current pass's (its pace times the units left), so it
    // names the pass: during `--eval-dense` it is the evaluation's, not the
    // run's.
    let pass = state.run.progress.as_ref().map_or("", pass_name);
    let eta = state
        .run
        .eta_s()
        .map_or(String::new(), |e| format!("   ETA {} ({pass})", clock(e)));
    let width = area.width.saturating_sub(2) as usize;
    let what = format!(
        "model {}   method {}",
        or_dash(&state.model),
        or_dash(&state.method)
    );
    let time = format!("elapsed {}{eta}", clock(state.run.elapsed_s));
    let status = Span::styled(status, Style::new().fg(color));
    // Where the line does not fit, the run's status and time come first
    // and the model's name is what the edge cuts (the command above
    // names it too).
    let room = width.saturating_sub(time.chars().count() + status.width() + 6);
    let second = match what.chars().count() <= room {
        true => vec![Span::raw(format!("{what}   {time}   ")), status],
        false => vec![
            status,
            Span::raw(format!("   {time}   ")),
            Span::raw(truncate(&what, room)),
        ],
    };
    let lines = vec![
        Line::from(Span::styled(
            truncate(&state.command, area.width.saturating_sub(3) as usize),
            Style::new().add_modifier(Modifier::BOLD),
        )),
        Line::from(second),
    ];
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" run ")),
        area,
    );
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "–" } else { s }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// A byte count in the unit the chart's axis uses.
fn scaled(bytes: u64, unit: f64) -> f64 {
    bytes as f64 / unit
}

fn draw_chart(frame: &mut Frame, area: Rect, state: &UiState) {
    let t_end = state.run.points.last().map_or(1.0, |p| p.t).max(1.0);
    let t_start = state.run.points.first().map_or(0.0, |p| p.t);
    let top = state
        .run
        .points
        .iter()
        .flat_map(|p| [p.rss, p.heap, p.reserved, p.gpu_used])
        .flatten()
        .max()
        .unwrap_or(1 << 20);
    let (unit, unit_name) = if top >= 4 << 30 {
        ((1u64 << 30) as f64, "GiB")
    } else {
        ((1u64 << 20) as f64, "MiB")
    };
    let y_max = scaled(top, unit) * 1.1;
    let series = |f: fn(&crate::events::fold::Point) -> Option<u64>| -> Vec<(f64, f64)> {
        state
            .run
            .points
            .iter()
            .filter_map(|p| f(p).map(|v| (p.t, scaled(v, unit))))
            .collect()
    };
    let rss = series(|p| p.rss);
    let heap = series(|p| p.heap);
    let reserved = series(|p| p.reserved);
    let gpu = series(|p| p.gpu_used);
    // Stage boundaries other than per-layer ones, as vertical lines.
    let marks: Vec<Vec<(f64, f64)>> = state
        .run
        .outline()
        .map(|s| vec![(s.point.t, 0.0), (s.point.t, y_max)])
        .collect();
    let mut datasets = Vec::new();
    for m in &marks {
        datasets.push(
            Dataset::default()
                .graph_type(GraphType::Line)
                .marker(Marker::Braille)
                .style(Style::new().fg(Color::DarkGray))
                .data(m),
        );
    }
    for (name, data, color) in [
        ("RSS", &rss, Color::Green),
        ("allocated", &heap, Color::Blue),
        ("reserved", &reserved, Color::Magenta),
        ("GPU used", &gpu, Color::Yellow),
    ] {
        if !data.is_empty() {
            datasets.push(
                Dataset::default()
                    .name(name)
                    .graph_type(GraphType::Line)
                    .marker(Marker::Braille)
                    .style(Style::new().fg(color))
                    .data(data),
            );
        }
    }
    let chart = Chart::new(datasets)
        .block(Block::bordered().title(format!(" history ({unit_name}; grey = stages) ")))
        .x_axis(
            Axis::default()
                .bounds([t_start, t_end])
                .labels([format!("{t_start:.0}s"), format!("{t_end:.0}s")]),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, y_max])
                .labels(["0".to_string(), format!("{:.0}", y_max / 1.1)]),
        );
    frame.render_widget(chart, area);
}

fn delta_text(d: Option<i64>) -> String {
    match d {
        Some(d) if d < 0 => format!("-{}", format_bytes(d.unsigned_abs())),
        Some(d) => format!("+{}", format_bytes(d as u64)),
        None => "n/a".into(),
    }
}

fn draw_stages(frame: &mut Frame, area: Rect, state: &UiState) {
    let visible = area.height.saturating_sub(3) as usize;
    let peak_row = state.run.peak_stage();
    // Show the rows ending at the scroll position.
    let end = (state.stage_scroll + 1).min(state.run.stages.len());
    let start = end.saturating_sub(visible);
    let text = |v: Option<u64>| v.map_or("n/a".to_string(), format_bytes);
    let rows = state.run.stages[start..end]
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let style = if Some(start + k) == peak_row {
                Style::new().fg(Color::Black).bg(Color::Yellow)
            } else {
                Style::new()
            };
            Row::new(vec![
                Cell::from(r.label().to_string()),
                Cell::from(text(r.point.rss)),
                Cell::from(text(r.point.heap)),
                Cell::from(text(r.peak)),
                Cell::from(delta_text(r.delta)),
                Cell::from(format!("{:.1}s", r.seconds)),
            ])
            .style(style)
        });
    let focus = if state.focus == Focus::Stages {
        " ◆"
    } else {
        ""
    };
    let table = Table::new(
        rows,
        [
            Constraint::Min(16),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(10),
            Constraint::Length(6),
        ],
    )
    .header(
        Row::new(["stage", "RSS", "alloc", "peak", "Δ RSS", "time"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(Block::bordered().title(format!(" stages (peak highlighted){focus} ")));
    frame.render_widget(table, area);
}

fn draw_progress(frame: &mut Frame, area: Rect, state: &UiState) {
    let current = state.run.stages.last().map_or("–", |s| s.label());
    let (ratio, mut label) = match &state.run.progress {
        Some(p) => (
            p.done as f64 / p.total.max(1) as f64,
            format!("{}/{} {}   stage {current}", p.done, p.total, p.name),
        ),
        None => (0.0, format!("stage {current}")),
    };
    // A distributed run: where every other rank is, from its own log.
    for (rank, r) in &state.run.ranks {
        let at = match (r.done, r.total, &r.finished) {
            (_, _, Some(status)) => status.clone(),
            (Some(d), Some(t), None) => format!("{d}/{t}"),
            _ => r.stage.clone().unwrap_or_else(|| "starting".into()),
        };
        let rss = r.rss.map_or("n/a".into(), crate::units::format_bytes);
        label.push_str(&format!("   rank {rank} {at} {rss}"));
    }
    // Training counts optimizer steps; everything else, decoder layers.
    let training = state
        .run
        .plan
        .as_ref()
        .is_some_and(|p| p.command == "train");
    let title = if training { " steps " } else { " layers " };
    let gauge = Gauge::default()
        .block(Block::bordered().title(title))
        .gauge_style(Style::new().fg(Color::Cyan))
        .ratio(ratio.clamp(0.0, 1.0))
        .label(label);
    frame.render_widget(gauge, area);
}

fn draw_messages(frame: &mut Frame, area: Rect, state: &UiState) {
    let visible = area.height.saturating_sub(2) as usize;
    let end = if state.focus == Focus::Messages {
        (state.message_scroll + 1).min(state.messages.len())
    } else {
        state.messages.len()
    };
    let start = end.saturating_sub(visible);
    let lines: Vec<Line> = state.messages[start..end]
        .iter()
        .map(|(level, text)| {
            let (tag, color) = match level {
                Level::Info => ("info ", Color::Gray),
                Level::Warn => ("warn ", Color::Yellow),
                Level::Error => ("error", Color::Red),
            };
            Line::from(vec![
                Span::styled(tag, Style::new().fg(color)),
                Span::raw(" "),
                Span::raw(text.clone()),
            ])
        })
        .collect();
    let focus = if state.focus == Focus::Messages {
        " ◆"
    } else {
        ""
    };
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(format!(" messages{focus} "))),
        area,
    );
}

fn draw_keys(frame: &mut Frame, area: Rect, state: &UiState) {
    let quit = match state.mode {
        Mode::Owner if state.finished.is_none() => "q stop run",
        _ => "q quit",
    };
    let dropped = if state.dropped > 0 {
        format!("   {} samples merged", state.dropped)
    } else {
        String::new()
    };
    let text = format!("{quit}   p pause   tab focus   ↑↓ scroll   ? help{dropped}");
    frame.render_widget(
        Paragraph::new(text).style(Style::new().fg(Color::DarkGray)),
        area,
    );
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

fn draw_help(frame: &mut Frame, area: Rect) {
    let text = vec![
        Line::from("q / Esc   quit (a running prune asks first)"),
        Line::from("Ctrl-C    stop the run now"),
        Line::from("p         pause / resume the view (the run goes on)"),
        Line::from("tab       switch focus: stages, messages"),
        Line::from("↑ ↓ PgUp PgDn Home End   scroll the focused panel"),
        Line::from("?         this help (any key closes)"),
    ];
    let r = centered(area, 60, 8);
    frame.render_widget(Clear, r);
    frame.render_widget(
        Paragraph::new(text).block(Block::bordered().title(" keys ")),
        r,
    );
}

fn draw_confirm(frame: &mut Frame, area: Rect, state: &UiState) {
    let r = centered(area, 56, 3);
    let what = if state.command.starts_with("prunemem watch") || state.command.contains(" watch ") {
        "Stop the watched command?"
    } else {
        "Stop the run? Logs are flushed."
    };
    frame.render_widget(Clear, r);
    frame.render_widget(
        Paragraph::new(format!("{what}  y = stop, any other key = go on"))
            .block(Block::bordered().title(" quit ")),
        r,
    );
}

mod gauges;
#[cfg(test)]
mod tests;
