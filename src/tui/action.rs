//! The one vocabulary of the workbench: every [`Action`] a key can trigger, the default keymap, and
//! the help lines built from it. Keys, the help screen and the tests all speak in actions, so a
//! binding shown by `?` is the binding that works.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// Where a binding applies: everywhere, or in one view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Global,
    Runs,
    Dashboard,
    Samples,
    Workers,
    Events,
    Episodes,
    Debugger,
}

impl Scope {
    pub const ALL: [Scope; 8] = [
        Scope::Global,
        Scope::Runs,
        Scope::Dashboard,
        Scope::Samples,
        Scope::Workers,
        Scope::Events,
        Scope::Episodes,
        Scope::Debugger,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Runs => "runs",
            Scope::Dashboard => "dashboard",
            Scope::Samples => "samples",
            Scope::Workers => "workers",
            Scope::Events => "events",
            Scope::Episodes => "episodes",
            Scope::Debugger => "debugger",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    Back,
    ToggleHelp,
    /// Start typing a filter (`/`).
    Filter,
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    Left,
    Right,
    /// Drill down: run → dashboard.
    Open,
    NextPane,
    PrevPane,
    /// Jump to the n-th view (1-based).
    View(u8),
    Refresh,
    /// Runs: mark the selected run for comparison.
    Mark,
    /// Runs: cycle the sort column.
    Sort,
    /// Dashboard: narrow or widen the x window around its centre; `=` shows everything.
    ZoomIn,
    ZoomOut,
    ZoomReset,
    /// Dashboard: the focused panel fills the view, or goes back into the grid.
    Expand,
    /// Dashboard: stop (or restart) following new points while a run is live.
    Freeze,
    /// Dashboard: x-axis in steps or wall time.
    ToggleXAxis,
    /// Dashboard: pick the focused panel's next series (for `HideSeries`).
    PickSeries,
    /// Dashboard: hide the picked series, or show it again.
    HideSeries,
    /// Dashboard: show every hidden series again.
    ShowAllSeries,
    SmoothMore,
    SmoothLess,
    /// Open the command palette (`:`): every action by name.
    Palette,
    /// Write the open (or selected) run's plots and CSV to `exports/`.
    Export,
    /// Runs: start a new run from a config, with overrides edited in a form.
    NewRun,
    /// Runs: ask the selected live run to stop after its step (it writes a checkpoint).
    StopRun,
    /// Runs: delete the selected run's records from the store, after a confirmation.
    DeleteRun,
    /// Runs: pause the selected live run, or let a paused one continue.
    PauseRun,
    /// Runs: continue the selected stopped or failed run from its last checkpoint.
    ResumeRun,
    /// Runs: open the dashboard with every marked run overlaid.
    Compare,
    /// Replay: start it at the current step, or leave it and follow the newest step again.
    Replay,
    /// Replay: one step back or forward; ten with the Shift keys.
    StepBack,
    StepForward,
    StepBack10,
    StepForward10,
    /// Replay: play from the selected step on, or pause.
    Play,
    /// Replay: the next play speed (steps per second).
    Speed,
    /// Samples: follow the selected prompt across steps, or stop following it.
    Follow,
    /// Samples: every response, the wrong ones only, or the groups with all-equal rewards only.
    Narrow,
    /// Samples: groups in recorded order, or the lowest mean reward first.
    WorstFirst,
    /// Samples: the selected sample's tokens with the student's and the teachers' log-probs.
    Tokens,
    /// Episodes: training or evaluation episodes.
    Validation,
    /// Debugger: take the env's Left action (grid envs)
    MoveLeft,
    MoveDown,
    MoveRight,
    MoveUp,
    /// Debugger: pick one of the env's actions from a list
    PickAction,
    /// Debugger: type the policy's whole output (a malformed one on purpose)
    TypeOutput,
    /// Debugger: the policy of `s` and `e`: human, random, model
    CyclePolicy,
    /// Debugger: one turn by the policy
    StepTurn,
    /// Debugger: turns by the policy until the episode ends
    RunToEnd,
    /// Debugger: back one turn
    Undo,
    /// Debugger: go back to the selected turn to play it differently
    Fork,
    /// Debugger: a new episode from the next seed
    NewEpisode,
    /// Debugger: the same episode again from its seed
    RestartEpisode,
    /// Debugger: draw the current turn N times and show the actions' distribution
    Resample,
    /// Debugger: save the episode to the store as a trajectory tagged debug
    SaveSession,
    /// Debugger: write the episode as JSON lines under exports/
    ExportSession,
    /// Debugger: the model (a directory or RUN@STEP)
    ChooseModel,
    /// Debugger: temperature, top-k, top-p and tokens per turn
    EditSampling,
    /// Debugger: the environment, its parameters and seed
    ChooseEnv,
    /// Debugger: the previous / next token of the output
    PrevToken,
    NextToken,
    /// Episodes: open the selected episode at the selected turn in the debugger
    DebugEpisode,
}

impl Action {
    /// Every action, for the keys config file (`View(n)` is `view_1` … `view_7`).
    pub const ALL: [Action; 78] = [
        Action::Quit,
        Action::Back,
        Action::ToggleHelp,
        Action::Filter,
        Action::Up,
        Action::Down,
        Action::PageUp,
        Action::PageDown,
        Action::Top,
        Action::Bottom,
        Action::Left,
        Action::Right,
        Action::Open,
        Action::NextPane,
        Action::PrevPane,
        Action::View(1),
        Action::View(2),
        Action::View(3),
        Action::View(4),
        Action::View(5),
        Action::View(6),
        Action::View(7),
        Action::Refresh,
        Action::Mark,
        Action::Sort,
        Action::ZoomIn,
        Action::ZoomOut,
        Action::ZoomReset,
        Action::Expand,
        Action::Freeze,
        Action::ToggleXAxis,
        Action::PickSeries,
        Action::HideSeries,
        Action::ShowAllSeries,
        Action::SmoothMore,
        Action::SmoothLess,
        Action::Palette,
        Action::Export,
        Action::NewRun,
        Action::StopRun,
        Action::DeleteRun,
        Action::PauseRun,
        Action::ResumeRun,
        Action::Compare,
        Action::Replay,
        Action::StepBack,
        Action::StepForward,
        Action::StepBack10,
        Action::StepForward10,
        Action::Play,
        Action::Speed,
        Action::Follow,
        Action::Narrow,
        Action::WorstFirst,
        Action::Tokens,
        Action::Validation,
        Action::MoveLeft,
        Action::MoveDown,
        Action::MoveRight,
        Action::MoveUp,
        Action::PickAction,
        Action::TypeOutput,
        Action::CyclePolicy,
        Action::StepTurn,
        Action::RunToEnd,
        Action::Undo,
        Action::Fork,
        Action::NewEpisode,
        Action::RestartEpisode,
        Action::Resample,
        Action::SaveSession,
        Action::ExportSession,
        Action::ChooseModel,
        Action::EditSampling,
        Action::ChooseEnv,
        Action::PrevToken,
        Action::NextToken,
        Action::DebugEpisode,
    ];

    /// The action's name in the keys config file: its variant in snake case.
    pub fn name(self) -> String {
        match self {
            Action::View(n) => format!("view_{n}"),
            other => {
                let debug = format!("{other:?}");
                let mut out = String::new();
                for (i, c) in debug.chars().enumerate() {
                    if c.is_ascii_uppercase() && i > 0 {
                        out.push('_');
                    }
                    out.push(c.to_ascii_lowercase());
                }
                out
            }
        }
    }

    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether the action means anything in a view of `scope`: replay moves through the open
    /// run, which the runs list is not.
    pub fn applies_in(self, scope: Scope) -> bool {
        let replay = matches!(
            self,
            Action::Replay
                | Action::StepBack
                | Action::StepForward
                | Action::StepBack10
                | Action::StepForward10
                | Action::Play
                | Action::Speed
        );
        // The debugger has no run to replay, filter, export or reload.
        let run_only = matches!(self, Action::Filter | Action::Export | Action::Refresh);
        !(replay && matches!(scope, Scope::Runs | Scope::Debugger)
            || run_only && scope == Scope::Debugger)
    }

    /// What the action does in a view of `scope`, where that differs from [`Action::describe`].
    pub fn describe_in(self, scope: Scope) -> &'static str {
        match (scope, self) {
            (Scope::Samples, Action::Left) => "previous step",
            (Scope::Samples, Action::Right) => "next step",
            (Scope::Samples, Action::Open) => "show the whole response",
            (Scope::Samples, Action::NextPane | Action::PrevPane) => "domain filter",
            (Scope::Workers, Action::NextPane | Action::PrevPane) => "workers / devices",
            (Scope::Events, Action::NextPane | Action::PrevPane) => "kind filter",
            (Scope::Episodes, Action::Left) => "previous step",
            (Scope::Episodes, Action::Right) => "next step",
            (Scope::Episodes, Action::NextPane | Action::PrevPane | Action::Open) => {
                "episodes / turns"
            }
            (Scope::Dashboard, Action::Open) => "samples of the step",
            (Scope::Debugger, Action::NextPane | Action::PrevPane) => {
                "prompt / output / info / samples"
            }
            (Scope::Debugger, Action::Up) => "previous turn",
            (Scope::Debugger, Action::Down) => "next turn",
            (Scope::Debugger, Action::PageUp | Action::PageDown) => "scroll the detail",
            _ => self.describe(),
        }
    }

    /// What the action does, for the help screen.
    pub fn describe(self) -> &'static str {
        match self {
            Action::Quit => "quit",
            Action::Back => "back / close",
            Action::ToggleHelp => "this help",
            Action::Filter => "filter",
            Action::Up => "up",
            Action::Down => "down",
            Action::PageUp => "page up",
            Action::PageDown => "page down",
            Action::Top => "first",
            Action::Bottom => "last",
            Action::Left => "pan left",
            Action::Right => "pan right",
            Action::Open => "open",
            Action::NextPane => "next panel",
            Action::PrevPane => "previous panel",
            Action::View(_) => "go to view",
            Action::Refresh => "reload from the store",
            Action::Mark => "mark for comparison",
            Action::Sort => "sort by the next column",
            Action::ZoomIn => "zoom in",
            Action::ZoomOut => "zoom out",
            Action::ZoomReset => "show every step",
            Action::Expand => "expand panel",
            Action::Freeze => "freeze live updates",
            Action::ToggleXAxis => "x-axis: step / wall time",
            Action::PickSeries => "pick the panel's next series",
            Action::HideSeries => "hide / show the picked series",
            Action::ShowAllSeries => "show every hidden series",
            Action::SmoothMore => "more smoothing",
            Action::SmoothLess => "less smoothing",
            Action::Palette => "command palette",
            Action::Export => "export plots (PNG, SVG), CSV and TensorBoard",
            Action::NewRun => "new run from a config",
            Action::StopRun => "stop the run (after its step)",
            Action::DeleteRun => "delete the run's records (asks first)",
            Action::PauseRun => "pause / continue the run",
            Action::ResumeRun => "resume from the last checkpoint",
            Action::Compare => "compare the marked runs",
            Action::Replay => "replay: start / leave",
            Action::StepBack => "replay: step back",
            Action::StepForward => "replay: step forward",
            Action::StepBack10 => "replay: 10 steps back",
            Action::StepForward10 => "replay: 10 steps forward",
            Action::Play => "replay: play / pause",
            Action::Speed => "replay: play speed",
            Action::Follow => "follow this prompt across steps",
            Action::Narrow => "all / wrong only / flat groups only",
            Action::WorstFirst => "sort groups: recorded / worst reward first",
            Action::Tokens => "per-token log-probs: student / teachers",
            Action::Validation => "training / evaluation episodes",
            Action::MoveLeft => "env action Left",
            Action::MoveDown => "env action Down",
            Action::MoveRight => "env action Right",
            Action::MoveUp => "env action Up",
            Action::PickAction => "pick an env action",
            Action::TypeOutput => "type an output",
            Action::CyclePolicy => "policy: human / random / model",
            Action::StepTurn => "step one turn",
            Action::RunToEnd => "run to the end",
            Action::Undo => "undo the last turn",
            Action::Fork => "fork at the selected turn",
            Action::NewEpisode => "new episode (next seed)",
            Action::RestartEpisode => "restart (same seed)",
            Action::Resample => "resample the turn",
            Action::SaveSession => "save to the store",
            Action::ExportSession => "export as JSONL",
            Action::ChooseModel => "choose the model",
            Action::EditSampling => "sampling settings",
            Action::ChooseEnv => "choose the environment",
            Action::PrevToken => "previous token",
            Action::NextToken => "next token",
            Action::DebugEpisode => "debug this episode",
        }
    }
}

/// One binding: a key (with its modifiers), where it applies, and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub code: KeyCode,
    pub modifiers: KeyModifiers,
    pub scope: Scope,
    pub action: Action,
}

const fn key(code: KeyCode, scope: Scope, action: Action) -> Binding {
    Binding {
        code,
        modifiers: KeyModifiers::NONE,
        scope,
        action,
    }
}

const fn ctrl(c: char, scope: Scope, action: Action) -> Binding {
    Binding {
        code: KeyCode::Char(c),
        modifiers: KeyModifiers::CONTROL,
        scope,
        action,
    }
}

use Action as A;
use KeyCode as K;
use Scope as S;

/// The default keymap: vim keys and arrows, `?` help, `q`/Ctrl-C quit, `Esc` back, `/` filter.
pub const DEFAULT_KEYS: &[Binding] = &[
    key(K::Char('q'), S::Global, A::Quit),
    ctrl('c', S::Global, A::Quit),
    key(K::Esc, S::Global, A::Back),
    key(K::Char('?'), S::Global, A::ToggleHelp),
    key(K::Char('/'), S::Global, A::Filter),
    key(K::Char('k'), S::Global, A::Up),
    key(K::Up, S::Global, A::Up),
    key(K::Char('j'), S::Global, A::Down),
    key(K::Down, S::Global, A::Down),
    key(K::PageUp, S::Global, A::PageUp),
    ctrl('u', S::Global, A::PageUp),
    key(K::PageDown, S::Global, A::PageDown),
    ctrl('d', S::Global, A::PageDown),
    key(K::Char('g'), S::Global, A::Top),
    key(K::Home, S::Global, A::Top),
    key(K::Char('G'), S::Global, A::Bottom),
    key(K::End, S::Global, A::Bottom),
    key(K::Enter, S::Global, A::Open),
    key(K::Tab, S::Dashboard, A::NextPane),
    key(K::BackTab, S::Dashboard, A::PrevPane),
    key(K::Char('1'), S::Global, A::View(1)),
    key(K::Char('2'), S::Global, A::View(2)),
    key(K::Char('3'), S::Global, A::View(3)),
    key(K::Char('4'), S::Global, A::View(4)),
    key(K::Char('5'), S::Global, A::View(5)),
    key(K::Char('6'), S::Global, A::View(6)),
    key(K::Char('7'), S::Global, A::View(7)),
    ctrl('r', S::Global, A::Refresh),
    key(K::Char(':'), S::Global, A::Palette),
    key(K::Char('E'), S::Global, A::Export),
    key(K::Char('r'), S::Global, A::Replay),
    key(K::Char(','), S::Global, A::StepBack),
    key(K::Char('.'), S::Global, A::StepForward),
    key(K::Char('<'), S::Global, A::StepBack10),
    key(K::Char('>'), S::Global, A::StepForward10),
    key(K::Char(' '), S::Global, A::Play),
    key(K::Char('t'), S::Global, A::Speed),
    key(K::Char(' '), S::Runs, A::Mark),
    key(K::Char('s'), S::Runs, A::Sort),
    key(K::Char('n'), S::Runs, A::NewRun),
    key(K::Char('X'), S::Runs, A::StopRun),
    key(K::Char('D'), S::Runs, A::DeleteRun),
    key(K::Char('p'), S::Runs, A::PauseRun),
    key(K::Char('r'), S::Runs, A::ResumeRun),
    key(K::Char('c'), S::Runs, A::Compare),
    key(K::Char('h'), S::Samples, A::Left),
    key(K::Left, S::Samples, A::Left),
    key(K::Char('l'), S::Samples, A::Right),
    key(K::Right, S::Samples, A::Right),
    key(K::Char('f'), S::Samples, A::Follow),
    key(K::Char('w'), S::Samples, A::Narrow),
    key(K::Char('s'), S::Samples, A::WorstFirst),
    key(K::Char('T'), S::Samples, A::Tokens),
    key(K::Tab, S::Samples, A::NextPane),
    key(K::BackTab, S::Samples, A::PrevPane),
    key(K::Tab, S::Workers, A::NextPane),
    key(K::BackTab, S::Workers, A::PrevPane),
    key(K::Char('h'), S::Episodes, A::Left),
    key(K::Left, S::Episodes, A::Left),
    key(K::Char('l'), S::Episodes, A::Right),
    key(K::Right, S::Episodes, A::Right),
    key(K::Char('v'), S::Episodes, A::Validation),
    key(K::Char('T'), S::Episodes, A::Tokens),
    key(K::Tab, S::Episodes, A::NextPane),
    key(K::BackTab, S::Episodes, A::PrevPane),
    key(K::Char('D'), S::Episodes, A::DebugEpisode),
    key(K::Left, S::Debugger, A::MoveLeft),
    key(K::Down, S::Debugger, A::MoveDown),
    key(K::Right, S::Debugger, A::MoveRight),
    key(K::Up, S::Debugger, A::MoveUp),
    key(K::Char('a'), S::Debugger, A::PickAction),
    key(K::Char('i'), S::Debugger, A::TypeOutput),
    key(K::Char('p'), S::Debugger, A::CyclePolicy),
    key(K::Char('s'), S::Debugger, A::StepTurn),
    key(K::Char('e'), S::Debugger, A::RunToEnd),
    key(K::Char('u'), S::Debugger, A::Undo),
    key(K::Char('f'), S::Debugger, A::Fork),
    key(K::Char('n'), S::Debugger, A::NewEpisode),
    key(K::Char('N'), S::Debugger, A::RestartEpisode),
    key(K::Char('d'), S::Debugger, A::Resample),
    key(K::Char('w'), S::Debugger, A::SaveSession),
    key(K::Char('x'), S::Debugger, A::ExportSession),
    key(K::Char('m'), S::Debugger, A::ChooseModel),
    key(K::Char('t'), S::Debugger, A::EditSampling),
    key(K::Char('c'), S::Debugger, A::ChooseEnv),
    key(K::Char('['), S::Debugger, A::PrevToken),
    key(K::Char(']'), S::Debugger, A::NextToken),
    key(K::Tab, S::Debugger, A::NextPane),
    key(K::BackTab, S::Debugger, A::PrevPane),
    key(K::Tab, S::Events, A::NextPane),
    key(K::BackTab, S::Events, A::PrevPane),
    key(K::Char('h'), S::Dashboard, A::Left),
    key(K::Left, S::Dashboard, A::Left),
    key(K::Char('l'), S::Dashboard, A::Right),
    key(K::Right, S::Dashboard, A::Right),
    key(K::Char('+'), S::Dashboard, A::ZoomIn),
    key(K::Char('-'), S::Dashboard, A::ZoomOut),
    key(K::Char('='), S::Dashboard, A::ZoomReset),
    key(K::Char('e'), S::Dashboard, A::Expand),
    key(K::Char('f'), S::Dashboard, A::Freeze),
    key(K::Char('w'), S::Dashboard, A::ToggleXAxis),
    key(K::Char('s'), S::Dashboard, A::PickSeries),
    key(K::Char('x'), S::Dashboard, A::HideSeries),
    key(K::Char('a'), S::Dashboard, A::ShowAllSeries),
    key(K::Char(']'), S::Dashboard, A::SmoothMore),
    key(K::Char('['), S::Dashboard, A::SmoothLess),
];

/// The action `event` triggers in a view of `scope`: that view's binding first, then a global one.
pub fn action_for(keys: &[Binding], scope: Scope, event: &KeyEvent) -> Option<Action> {
    // Shifted characters arrive as the character with SHIFT set ('G', '?', '+'): match on the
    // character alone.
    let modifiers = match event.code {
        KeyCode::Char(_) => event.modifiers - KeyModifiers::SHIFT,
        _ => event.modifiers,
    };
    let matches = |b: &&Binding| b.code == event.code && b.modifiers == modifiers;
    let find = |s: Scope| keys.iter().filter(|b| b.scope == s).find(matches);
    find(scope)
        .or_else(|| find(Scope::Global))
        .map(|b| b.action)
}

/// How a key is written in help: `q`, `Ctrl-c`, `Enter`, `PgUp`.
pub fn key_name(b: &Binding) -> String {
    let base = match b.code {
        KeyCode::Char(' ') => "Space".to_string(),
        KeyCode::Char(c) => c.to_string(),
        KeyCode::Enter => "Enter".into(),
        KeyCode::Esc => "Esc".into(),
        KeyCode::Tab => "Tab".into(),
        KeyCode::BackTab => "Shift-Tab".into(),
        KeyCode::Up => "↑".into(),
        KeyCode::Down => "↓".into(),
        KeyCode::Left => "←".into(),
        KeyCode::Right => "→".into(),
        KeyCode::PageUp => "PgUp".into(),
        KeyCode::PageDown => "PgDn".into(),
        KeyCode::Home => "Home".into(),
        KeyCode::End => "End".into(),
        other => format!("{other:?}"),
    };
    if b.modifiers.contains(KeyModifiers::CONTROL) {
        format!("Ctrl-{base}")
    } else {
        base
    }
}

/// One action as help and the palette list it: what it does in the view, and its keys there.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub what: &'static str,
    pub keys: String,
    pub action: Action,
}

/// The actions of a view of `scope`, once each with every key bound to it: the view's own
/// bindings first, then the global ones, leaving out global keys the view binds to something else.
pub fn entries(keys: &[Binding], scope: Scope) -> Vec<Entry> {
    let mut out: Vec<Entry> = vec![];
    for s in [scope, Scope::Global] {
        for b in keys.iter().filter(|b| b.scope == s) {
            let shadowed = s == Scope::Global
                && keys
                    .iter()
                    .any(|o| o.scope == scope && o.code == b.code && o.modifiers == b.modifiers);
            if shadowed || !b.action.applies_in(scope) {
                continue;
            }
            let what = match b.action {
                Action::View(1) => "view: runs",
                Action::View(2) => "view: dashboard",
                Action::View(3) => "view: samples",
                Action::View(4) => "view: workers and devices",
                Action::View(5) => "view: events and logs",
                Action::View(6) => "view: agentic episodes",
                Action::View(7) => "view: env debugger",
                other => other.describe_in(scope),
            };
            // Two actions a view describes alike (Tab and Shift-Tab both cycling one filter) are
            // one entry with both keys, not the same line twice.
            match out
                .iter_mut()
                .find(|e| e.action == b.action || e.what == what)
            {
                Some(e) => e.keys = format!("{} {}", e.keys, key_name(b)),
                None => out.push(Entry {
                    what,
                    keys: key_name(b),
                    action: b.action,
                }),
            }
        }
    }
    out
}

/// The help lines of a view: [`entries`], with the view keys on one line (`1 2 3 4 5  views`).
pub fn help_lines(keys: &[Binding], scope: Scope) -> Vec<(String, &'static str)> {
    let mut lines = vec![];
    let mut views = vec![];
    for e in entries(keys, scope) {
        match e.action {
            Action::View(_) => views.push(e.keys),
            _ => lines.push((e.keys, e.what)),
        }
    }
    if !views.is_empty() {
        lines.push((views.join(" "), "go to view (the numbered tabs)"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode, modifiers: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, modifiers)
    }

    #[test]
    fn view_bindings_come_before_global_ones_and_shift_is_ignored_for_characters() {
        let a = |scope, code, m| action_for(DEFAULT_KEYS, scope, &press(code, m));
        assert_eq!(
            a(Scope::Runs, K::Char('q'), KeyModifiers::NONE),
            Some(A::Quit)
        );
        assert_eq!(
            a(Scope::Runs, K::Char('c'), KeyModifiers::CONTROL),
            Some(A::Quit)
        );
        assert_eq!(
            a(Scope::Dashboard, K::Char('G'), KeyModifiers::SHIFT),
            Some(A::Bottom)
        );
        assert_eq!(
            a(Scope::Dashboard, K::Char('+'), KeyModifiers::SHIFT),
            Some(A::ZoomIn)
        );
        // `e` expands on the dashboard and means nothing on the runs list.
        assert_eq!(
            a(Scope::Dashboard, K::Char('e'), KeyModifiers::NONE),
            Some(A::Expand)
        );
        assert_eq!(a(Scope::Runs, K::Char('e'), KeyModifiers::NONE), None);
        // Ctrl-q is not q.
        assert_eq!(a(Scope::Runs, K::Char('q'), KeyModifiers::CONTROL), None);
    }

    #[test]
    fn help_lists_every_binding_of_the_view_once_per_action() {
        let lines = help_lines(DEFAULT_KEYS, Scope::Dashboard);
        let find = |what: &str| {
            lines
                .iter()
                .find(|(_, w)| *w == what)
                .map(|(k, _)| k.clone())
        };
        assert_eq!(find("zoom in").as_deref(), Some("+"));
        assert_eq!(find("pan left").as_deref(), Some("h ←"));
        assert_eq!(find("quit").as_deref(), Some("q Ctrl-c"));
        assert_eq!(find("down").as_deref(), Some("j ↓"));
        // Every dashboard and global binding's action appears.
        for b in DEFAULT_KEYS
            .iter()
            .filter(|b| matches!(b.scope, Scope::Dashboard | Scope::Global))
            .filter(|b| !matches!(b.action, Action::View(_)))
        {
            assert!(
                lines
                    .iter()
                    .any(|(_, w)| *w == b.action.describe_in(Scope::Dashboard)),
                "{:?} missing",
                b.action
            );
        }
        assert!(
            !help_lines(DEFAULT_KEYS, Scope::Runs)
                .iter()
                .any(|(_, w)| *w == "zoom in")
        );
    }

    #[test]
    fn actions_a_view_describes_alike_are_one_line() {
        // Tab and Shift-Tab both cycle the Events view's kind filter: one line, both keys.
        let lines = help_lines(DEFAULT_KEYS, Scope::Events);
        let kind: Vec<&String> = lines
            .iter()
            .filter(|(_, w)| *w == "kind filter")
            .map(|(k, _)| k)
            .collect();
        assert_eq!(kind, ["Tab Shift-Tab"]);
        for scope in [
            Scope::Samples,
            Scope::Workers,
            Scope::Episodes,
            Scope::Debugger,
        ] {
            let lines = help_lines(DEFAULT_KEYS, scope);
            let mut whats: Vec<&str> = lines.iter().map(|(_, w)| *w).collect();
            let all = whats.len();
            whats.sort_unstable();
            whats.dedup();
            assert_eq!(whats.len(), all, "{scope:?}: {lines:?}");
        }
    }
}
