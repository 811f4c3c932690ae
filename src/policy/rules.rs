//! Permission rules: `{"permissions": {"allow": [...], "ask": [...], "deny": [...], "default": …}}`.
//!
//! A rule is `TOOL` or `TOOL(PATTERN)`. `TOOL` is a registry name, or a glob over registry names
//! when it holds a `*` (`mcp__github__*`); Claude Code's names ([`CLAUDE_CODE_NAMES`]: `Bash`,
//! `Read`, `Write`, `Edit` (= `edit_file` and `write_file`), `MultiEdit`, `Glob`) are accepted for
//! the built-ins. What `PATTERN` is
//! matched against is the call's [`Subject`], which the tool declares ([`crate::ToolSpec::subject`]):
//!
//! * a **path** (the file tools): a gitignore-style glob over the workspace-relative path *after
//!   confinement* (`..` resolved away or refused, symlinks inside the workspace followed), so
//!   `read_file(**/.env)` also catches `./a/../.env` and a link to it. A pattern without `/`
//!   matches at any depth (`*.pem`), a leading `/` anchors it at the root, a trailing `/` means
//!   everything below; a rule that matches a directory matches everything in it.
//! * a **command** (`bash`): `bash(git status)` is that exact command, `bash(git log:*)` that
//!   command or that command followed by arguments, word by word after quote removal. The command
//!   is read with a bash grammar ([`command`]): a deny or ask rule matches when any command the
//!   shell may run matches — one of a compound command's, one after a wrapper (`env`, `timeout`,
//!   `find -exec`, …), one in code given to `eval`, `sh -c` or `trap` — and when part of the
//!   command cannot be read before it runs (`$cmd`, `eval "$x"`, `source`, `xargs`, …), such a
//!   rule *may* match: the call is asked about ([`Verdict::unseen`]). An allow rule matches only
//!   when every simple command as written matches an allow rule and nothing is hidden, no function
//!   is defined, no variable set and no output redirected to a file.
//!
//! Precedence: deny over ask over allow over the default (`ask` when absent).

mod command;

use std::cell::OnceCell;

use globset::{GlobBuilder, GlobMatcher};
use serde::Deserialize;
use serde_json::Value;

pub use crate::tool::Subject;

/// What a rule (or the default) says about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Runs.
    Allow,
    /// Needs an approval.
    Ask,
    /// Refused (`permission_denied`).
    Deny,
}

/// A policy that cannot be used: what is wrong, naming the file and the rule or key at fault,
/// and, when reading or parsing the file failed, that error as its
/// [`source`](std::error::Error::source). Its text is one line for a person: what is wrong, then
/// the source's own text.
#[derive(Debug, Clone)]
pub struct PolicyError {
    what: String,
    source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {source}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl std::error::Error for PolicyError {
    /// The error itself (an `std::io::Error`, a `serde_json::Error`), not the `Arc` holding it:
    /// `downcast_ref` finds it.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl PolicyError {
    /// What is wrong, with no underlying error.
    pub(crate) fn new(what: impl Into<String>) -> Self {
        PolicyError {
            what: what.into(),
            source: None,
        }
    }

    /// What failed, and the error that says why.
    pub(crate) fn with_source(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        PolicyError {
            what: what.into(),
            source: Some(std::sync::Arc::from(source.into())),
        }
    }

    /// The same error, its text preceded by `context` (the file or hook it came from).
    pub(crate) fn within(self, context: &str) -> Self {
        PolicyError {
            what: format!("{context}: {}", self.what),
            source: self.source,
        }
    }

    /// What is wrong, without its source.
    pub fn what(&self) -> &str {
        &self.what
    }
}

/// One parsed rule.
#[derive(Debug)]
pub struct Rule {
    text: String,
    label: std::sync::Arc<str>,
    tools: Vec<NameMatch>,
    pattern: Option<Pattern>,
}

#[derive(Debug)]
enum NameMatch {
    Exact(String),
    /// `PREFIX*` (the common MCP form), matched without a regex.
    Prefix(String),
    Glob(GlobMatcher),
}

#[derive(Debug)]
struct Pattern {
    /// The gitignore-style glob, for path subjects (`None` when the pattern is no valid glob:
    /// then it only matches commands).
    path: Option<GlobMatcher>,
    /// The command's words (`git log` of `git log:*`).
    words: Vec<String>,
    /// `:*`: the words may be followed by anything.
    prefix: bool,
}

/// A call's subject as the rules see it: a confined path, or a command read once per call.
struct Seen<'a> {
    subject: Option<&'a Confined>,
    view: OnceCell<command::View>,
}

impl Seen<'_> {
    fn view(&self, command: &str) -> &command::View {
        self.view.get_or_init(|| command::read(command))
    }
}

/// How a deny or ask rule applies to a call.
enum Fit {
    Yes,
    /// It may: part of the command cannot be read before it runs (why).
    Maybe(String),
    No,
}

impl Rule {
    /// Parses `TOOL` or `TOOL(PATTERN)`.
    pub(crate) fn parse(text: &str) -> Result<Rule, String> {
        let (tool, pattern) = match text.find('(') {
            None => (text, None),
            Some(open) => {
                let Some(inner) = text[open + 1..].strip_suffix(')') else {
                    return Err("a pattern must be closed by ')' at the end".into());
                };
                if inner.trim().is_empty() {
                    return Err("the pattern in '()' is empty".into());
                }
                (&text[..open], Some(inner))
            }
        };
        if tool.is_empty()
            || !tool
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'*')
        {
            return Err(format!(
                "{tool:?} is not a tool name (letters, digits, _, - and * only)"
            ));
        }
        let tools = aliases(tool)
            .into_iter()
            .map(|name| {
                if let Some(prefix) = name.strip_suffix('*').filter(|p| !p.contains('*')) {
                    Ok(NameMatch::Prefix(prefix.to_string()))
                } else if name.contains('*') {
                    GlobBuilder::new(&name)
                        .build()
                        .map(|g| NameMatch::Glob(g.compile_matcher()))
                        .map_err(|e| e.to_string())
                } else {
                    Ok(NameMatch::Exact(name))
                }
            })
            .collect::<Result<_, _>>()?;
        let pattern = pattern.map(Pattern::parse).transpose()?;
        Ok(Rule {
            text: text.to_string(),
            label: std::sync::Arc::from(format!("rule:{text}")),
            tools,
            pattern,
        })
    }

    /// The rule as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// `rule:TEXT`, as the audit log names it.
    pub fn label(&self) -> &std::sync::Arc<str> {
        &self.label
    }

    /// True when the rule names this tool (whatever its pattern).
    pub fn names(&self, tool: &str) -> bool {
        self.tools.iter().any(|m| match m {
            NameMatch::Exact(name) => name == tool,
            NameMatch::Prefix(prefix) => tool.starts_with(prefix.as_str()),
            NameMatch::Glob(g) => g.is_match(tool),
        })
    }

    /// Whether the rule matches a call of `tool` (a deny or ask rule: any command the shell may
    /// run).
    fn fits(&self, tool: &str, seen: &Seen<'_>) -> Fit {
        if !self.names(tool) {
            return Fit::No;
        }
        let Some(pattern) = &self.pattern else {
            return Fit::Yes;
        };
        match seen.subject {
            None => Fit::No,
            Some(Confined::Path(path)) => match pattern.matches_path(path) {
                true => Fit::Yes,
                false => Fit::No,
            },
            Some(Confined::Command(cmd)) => {
                match seen.view(cmd).may_run(&pattern.words, pattern.prefix) {
                    command::Fit::Yes => Fit::Yes,
                    command::Fit::Maybe(why) => Fit::Maybe(why),
                    command::Fit::No => Fit::No,
                }
            }
        }
    }

    /// Whether the rule, as an allow rule, takes the words of one simple command.
    fn takes(&self, words: &[command::Word]) -> bool {
        self.pattern
            .as_ref()
            .is_some_and(|p| command::fit(&p.words, words, p.prefix, false) == command::Fit::Yes)
    }
}

/// Claude Code's tool names and the built-in tools they stand for (MCP tools are named
/// `mcp__server__tool` by both). Permission rules and hook matchers take either name.
pub const CLAUDE_CODE_NAMES: &[(&str, &str)] = &[
    ("Bash", "bash"),
    ("Read", "read_file"),
    ("Write", "write_file"),
    ("Edit", "edit_file"),
    ("MultiEdit", "edit_file"),
    ("Glob", "glob"),
];

/// Claude Code's tools that have no counterpart here: a hook matcher naming one is refused
/// rather than accepted and never run.
pub const CLAUDE_CODE_ONLY: &[&str] = &[
    "Agent",
    "BashOutput",
    "ExitPlanMode",
    "Grep",
    "KillBash",
    "KillShell",
    "LS",
    "NotebookEdit",
    "NotebookRead",
    "SlashCommand",
    "Skill",
    "Task",
    "TodoRead",
    "TodoWrite",
    "WebFetch",
    "WebSearch",
];

/// The Claude Code names of a built-in tool (`edit_file`: `Edit`, `MultiEdit`).
pub fn claude_code_names(tool: &str) -> impl Iterator<Item = &'static str> + '_ {
    CLAUDE_CODE_NAMES
        .iter()
        .filter(move |(_, ours)| *ours == tool)
        .map(|(theirs, _)| *theirs)
}

fn aliases(tool: &str) -> Vec<String> {
    match tool {
        // In a permission rule, Claude Code's `Edit` covers every tool that edits files.
        "Edit" => vec!["edit_file".into(), "write_file".into()],
        other => match CLAUDE_CODE_NAMES
            .iter()
            .find(|(theirs, _)| *theirs == other)
        {
            Some((_, ours)) => vec![ours.to_string()],
            None => vec![other.to_string()],
        },
    }
}

impl Pattern {
    fn parse(raw: &str) -> Result<Pattern, String> {
        let prefix = raw.strip_suffix(":*");
        let path = gitignore_glob(raw).ok();
        if path.is_none() && prefix.is_none() && raw.contains(['*', '?', '[', '{']) {
            // A glob that does not compile is a mistake, not a command.
            return Err(gitignore_glob(raw).err().unwrap_or_default());
        }
        Ok(Pattern {
            path,
            words: prefix
                .unwrap_or(raw)
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            prefix: prefix.is_some(),
        })
    }

    fn matches_path(&self, path: &str) -> bool {
        let Some(glob) = &self.path else {
            return false;
        };
        // The path and each directory above it: a rule over a directory covers its contents.
        let mut end = path.len();
        loop {
            if glob.is_match(&path[..end]) {
                return true;
            }
            match path[..end].rfind('/') {
                Some(i) if i > 0 => end = i,
                _ => return false,
            }
        }
    }
}

/// A gitignore-style pattern as a glob over workspace-relative paths.
fn gitignore_glob(raw: &str) -> Result<GlobMatcher, String> {
    let mut p = raw.trim().trim_start_matches("./").to_string();
    let anchored = p.starts_with('/');
    if anchored {
        p = p.trim_start_matches('/').to_string();
    }
    if let Some(dir) = p.strip_suffix('/') {
        p = format!("{dir}/**");
    }
    if !anchored && !p.trim_end_matches("/**").contains('/') && !p.starts_with("**") {
        p = format!("**/{p}");
    }
    GlobBuilder::new(&p)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| e.to_string())
}

/// A subject ready for matching: a path confined to the workspace, or a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confined {
    /// Workspace-relative, `/`-separated, no `.` or `..`.
    Path(String),
    /// The command as given.
    Command(String),
}

impl Confined {
    /// Its text.
    pub fn text(&self) -> &str {
        match self {
            Confined::Path(s) | Confined::Command(s) => s,
        }
    }
}

/// The parsed `permissions` object.
#[derive(Debug)]
pub struct Rules {
    deny: Vec<Rule>,
    ask: Vec<Rule>,
    allow: Vec<Rule>,
    default: Action,
}

/// The first of `rules` at positions `at` that matches the call, else the first that may (with
/// why it may).
fn first_of<'r>(
    rules: &'r [Rule],
    at: &[u32],
    tool: &str,
    seen: &Seen<'_>,
) -> Option<(&'r Rule, Option<String>)> {
    let mut maybe = None;
    for rule in at.iter().map(|&i| &rules[i as usize]) {
        match rule.fits(tool, seen) {
            Fit::Yes => return Some((rule, None)),
            Fit::Maybe(why) if maybe.is_none() => maybe = Some((rule, Some(why))),
            Fit::Maybe(_) | Fit::No => {}
        }
    }
    maybe
}

/// What the rules decided, and which rule did (`None`: the default).
#[derive(Debug, Clone)]
pub struct Verdict<'a> {
    /// Allow, ask or deny.
    pub action: Action,
    /// The rule that decided (`None`: the default).
    pub rule: Option<&'a Rule>,
    /// Set when `rule` (a deny or ask rule) *may* match a command it cannot fully read: the
    /// action is then [`Action::Ask`], and this says what cannot be read.
    pub unseen: Option<String>,
    /// True when that rule is a deny rule: a hook's `allow` does not lift the ask then (it never
    /// lifts a deny rule).
    pub behind_deny: bool,
}

impl<'a> Verdict<'a> {
    fn of(action: Action, rule: Option<&'a Rule>) -> Verdict<'a> {
        Verdict {
            action,
            rule,
            unseen: None,
            behind_deny: false,
        }
    }
}

/// The positions of the rules that name one tool ([`Rules::index_for`]), and which rules they
/// are positions in (by address, so an index is never used with other rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleIndex {
    rules: usize,
    deny: Box<[u32]>,
    ask: Box<[u32]>,
    allow: Box<[u32]>,
    /// Whether a call of the tool may wait ([`crate::policy::Policy::waits_for`]), when the
    /// policy filled it in.
    pub(crate) waits: Option<bool>,
}

impl Rules {
    /// Every call allowed (a policy made only of hooks).
    pub fn allow_all() -> Rules {
        Rules {
            deny: Vec::new(),
            ask: Vec::new(),
            allow: Vec::new(),
            default: Action::Allow,
        }
    }

    /// Parses the `permissions` object; the error names the rule (or key) at fault.
    pub fn from_json(permissions: &Value) -> Result<Rules, PolicyError> {
        let Some(obj) = permissions.as_object() else {
            return Err(PolicyError::new("\"permissions\" must be an object"));
        };
        for key in obj.keys() {
            if !["allow", "ask", "deny", "default"].contains(&key.as_str()) {
                return Err(PolicyError::new(format!(
                    "unknown key \"permissions.{key}\" (expected allow, ask, deny, default)"
                )));
            }
        }
        let list = |key: &str| -> Result<Vec<Rule>, PolicyError> {
            let Some(v) = obj.get(key) else {
                return Ok(Vec::new());
            };
            let Some(items) = v.as_array() else {
                return Err(PolicyError::new(format!(
                    "\"permissions.{key}\" must be an array of rule strings"
                )));
            };
            items
                .iter()
                .map(|item| {
                    let Some(text) = item.as_str() else {
                        return Err(PolicyError::new(format!(
                            "permissions.{key}: {item} is not a rule string"
                        )));
                    };
                    Rule::parse(text).map_err(|e| {
                        PolicyError::new(format!("permissions.{key}: bad rule \"{text}\": {e}"))
                    })
                })
                .collect()
        };
        let default = match obj.get("default") {
            None => Action::Ask,
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                PolicyError::new(format!(
                    "\"permissions.default\" is {v}; expected \"allow\", \"ask\" or \"deny\""
                ))
            })?,
        };
        Ok(Rules {
            deny: list("deny")?,
            ask: list("ask")?,
            allow: list("allow")?,
            default,
        })
    }

    /// The rules that name `tool` (whatever their patterns), by position: [`Rules::decide_among`]
    /// then matches only those. A registered tool keeps its index
    /// (`crate::registry::RegisteredTool::policy_rules`), so a call walks the handful of rules
    /// about its tool, not the whole file.
    pub fn index_for(&self, tool: &str) -> RuleIndex {
        let positions = |rules: &[Rule]| -> Box<[u32]> {
            (0u32..)
                .zip(rules)
                .filter(|(_, r)| r.names(tool))
                .map(|(i, _)| i)
                .collect()
        };
        RuleIndex {
            rules: self as *const Rules as usize,
            deny: positions(&self.deny),
            ask: positions(&self.ask),
            allow: positions(&self.allow),
            waits: None,
        }
    }

    /// True when `index` was made by these rules.
    pub fn owns(&self, index: &RuleIndex) -> bool {
        index.rules == self as *const Rules as usize
    }

    /// [`Rules::decide`] through an index made by [`Rules::index_for`] for the same tool (an
    /// index made by other rules is ignored: the call walks every rule).
    pub fn decide_among(
        &self,
        index: &RuleIndex,
        tool: &str,
        subject: Option<&Confined>,
    ) -> Verdict<'_> {
        if !self.owns(index) {
            return self.decide(tool, subject);
        }
        let seen = Seen {
            subject,
            view: OnceCell::new(),
        };
        // The precedence: deny over ask over allow over the default. A deny rule that may match
        // a command it cannot fully read asks (and an ask rule that may, too).
        let deny = first_of(&self.deny, &index.deny, tool, &seen);
        if let Some((r, None)) = deny {
            return Verdict::of(Action::Deny, Some(r));
        }
        let ask = first_of(&self.ask, &index.ask, tool, &seen);
        let unseen = match (deny, ask) {
            (Some((r, Some(w))), _) => Some((r, w, true)),
            (None, Some((r, None))) => return Verdict::of(Action::Ask, Some(r)),
            (None, Some((r, Some(w)))) => Some((r, w, false)),
            (None, None) => None,
            (Some((_, None)), _) => unreachable!("a matching deny rule returned above"),
        };
        if let Some((rule, why, behind_deny)) = unseen {
            return Verdict {
                action: Action::Ask,
                rule: Some(rule),
                unseen: Some(why),
                behind_deny,
            };
        }
        if let Some(r) = self.allowed_by(index, tool, &seen) {
            return Verdict::of(Action::Allow, Some(r));
        }
        Verdict::of(self.default, None)
    }

    /// The allow rule that lets the call run, if one does: a rule without a pattern, or for a
    /// command, an allow rule for every simple command as written (the first one is named) when
    /// nothing of it is hidden; for a path, a rule that matches it.
    fn allowed_by(&self, index: &RuleIndex, tool: &str, seen: &Seen<'_>) -> Option<&Rule> {
        let mut rules = index.allow.iter().map(|&i| &self.allow[i as usize]);
        let Some(Confined::Command(cmd)) = seen.subject else {
            return rules.find(|r| matches!(r.fits(tool, seen), Fit::Yes));
        };
        if let Some(bare) = rules.clone().find(|r| r.pattern.is_none() && r.names(tool)) {
            return Some(bare);
        }
        let view = seen.view(cmd);
        if view.not_allowable().is_some() {
            return None;
        }
        let mut first = None;
        for words in &view.written {
            let rule = rules.clone().find(|r| r.names(tool) && r.takes(words))?;
            first = first.or(Some(rule));
        }
        first
    }

    /// The first deny rule naming `tool` with a path pattern that matches one of `names`, with
    /// that name (used for the other names of a hard-linked file).
    pub fn denies_any<'r, 'n>(
        &'r self,
        tool: &str,
        names: &'n [String],
    ) -> Option<(&'r Rule, &'n str)> {
        self.deny
            .iter()
            .filter(|r| r.names(tool) && r.pattern.as_ref().is_some_and(|p| p.path.is_some()))
            .find_map(|r| {
                let pattern = r.pattern.as_ref()?;
                names
                    .iter()
                    .find(|n| pattern.matches_path(n))
                    .map(|n| (r, n.as_str()))
            })
    }

    /// Whether a deny rule naming `tool` has a path pattern.
    pub fn denies_paths_of(&self, tool: &str) -> bool {
        self.deny
            .iter()
            .any(|r| r.names(tool) && r.pattern.as_ref().is_some_and(|p| p.path.is_some()))
    }

    /// The decision for a call of `tool` about `subject`: deny over ask over allow over the
    /// default. Walks every rule (it builds the tool's index first); calls of a registered tool go
    /// through its kept index instead ([`Rules::decide_among`]).
    pub fn decide(&self, tool: &str, subject: Option<&Confined>) -> Verdict<'_> {
        self.decide_among(&self.index_for(tool), tool, subject)
    }

    /// True when a call of `tool` could be asked about (an ask rule names it, or the default is
    /// ask) — such calls never run in place.
    pub fn may_ask(&self, tool: &str) -> bool {
        self.default == Action::Ask || self.ask.iter().any(|r| r.names(tool))
    }

    /// True when some call could be asked about (an ask rule, or a default of ask).
    pub fn has_ask(&self) -> bool {
        self.default == Action::Ask || !self.ask.is_empty()
    }

    /// True when there are no rules and the default allows: nothing to match.
    pub fn allows_everything(&self) -> bool {
        self.is_empty() && self.default == Action::Allow
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.deny.len() + self.ask.len() + self.allow.len()
    }

    /// True when there are no rules (only the default).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(v: Value) -> Rules {
        Rules::from_json(&v).unwrap()
    }
    fn path(p: &str) -> Option<Confined> {
        Some(Confined::Path(p.into()))
    }
    fn cmd(c: &str) -> Option<Confined> {
        Some(Confined::Command(c.into()))
    }
    fn action(r: &Rules, tool: &str, s: Option<Confined>) -> (Action, Option<String>) {
        let v = r.decide(tool, s.as_ref());
        (v.action, v.rule.map(|r| r.text().to_string()))
    }

    #[test]
    fn a_tool_s_index_holds_the_rules_that_name_it_and_decides_with_their_precedence() {
        let r = rules(json!({
            "deny": ["bash(rm:*)", "read_file(**/.env)", "mcp__github__*", "Write(.git/**)"],
            "ask": ["write_file(src/**)", "bash(git push:*)", "mcp__fs__write*"],
            "allow": ["bash(git status)", "read_file", "mcp__github__list*", "glob"],
            "default": "ask"
        }));
        let other = rules(json!({"deny": ["read_file"], "default": "allow"}));
        let cases = [
            ("bash", cmd("rm -rf /"), Action::Deny, Some("bash(rm:*)")),
            (
                "bash",
                cmd("git status"),
                Action::Allow,
                Some("bash(git status)"),
            ),
            (
                "bash",
                cmd("git push origin"),
                Action::Ask,
                Some("bash(git push:*)"),
            ),
            ("bash", cmd("ls"), Action::Ask, None),
            (
                "read_file",
                path("a/.env"),
                Action::Deny,
                Some("read_file(**/.env)"),
            ),
            (
                "read_file",
                path("src/x.rs"),
                Action::Allow,
                Some("read_file"),
            ),
            (
                "write_file",
                path("src/x.rs"),
                Action::Ask,
                Some("write_file(src/**)"),
            ),
            (
                "write_file",
                path(".git/config"),
                Action::Deny,
                Some("Write(.git/**)"),
            ),
            ("write_file", path("README.md"), Action::Ask, None),
            (
                "mcp__github__list_issues",
                None,
                Action::Deny,
                Some("mcp__github__*"),
            ),
            (
                "mcp__fs__write_file",
                None,
                Action::Ask,
                Some("mcp__fs__write*"),
            ),
            ("glob", None, Action::Allow, Some("glob")),
            ("noop", None, Action::Ask, None),
        ];
        for (tool, subject, action, rule) in &cases {
            let index = r.index_for(tool);
            let v = r.decide_among(&index, tool, subject.as_ref());
            assert_eq!(
                (v.action, v.rule.map(Rule::text)),
                (*action, *rule),
                "{tool} {subject:?}"
            );
            // An index made by other rules is never trusted: the call walks these rules.
            let foreign = other.index_for(tool);
            let v = r.decide_among(&foreign, tool, subject.as_ref());
            assert_eq!(
                v.action, *action,
                "{tool} {subject:?} with another policy's index"
            );
        }
        // The index holds only the rules that name the tool.
        assert_eq!(
            r.index_for("noop").deny.len() + r.index_for("noop").allow.len(),
            0
        );
        assert_eq!(r.index_for("bash").deny.len(), 1);
    }

    #[test]
    fn a_bare_tool_rule_matches_every_call_of_that_tool() {
        let r = rules(json!({"deny": ["bash"], "default": "allow"}));
        assert_eq!(action(&r, "bash", cmd("ls")).0, Action::Deny);
        assert_eq!(action(&r, "bash", None).0, Action::Deny);
        assert_eq!(action(&r, "read_file", path("a")).0, Action::Allow);
    }

    #[test]
    fn path_globs_are_gitignore_style_over_the_relative_path() {
        let r = rules(json!({
            "allow": ["write_file(src/**)"],
            "deny": ["read_file(**/.env)", "read_file(*.pem)", "read_file(/top.txt)", "edit_file(secrets/)"],
            "default": "ask"
        }));
        assert_eq!(
            action(&r, "write_file", path("src/a/b.rs")).0,
            Action::Allow
        );
        assert_eq!(action(&r, "write_file", path("docs/a.md")).0, Action::Ask);
        assert_eq!(action(&r, "read_file", path(".env")).0, Action::Deny);
        assert_eq!(action(&r, "read_file", path("a/b/.env")).0, Action::Deny);
        assert_eq!(action(&r, "read_file", path("a/b/.envrc")).0, Action::Ask);
        assert_eq!(action(&r, "read_file", path("keys/x.pem")).0, Action::Deny);
        assert_eq!(action(&r, "read_file", path("top.txt")).0, Action::Deny);
        assert_eq!(action(&r, "read_file", path("a/top.txt")).0, Action::Ask);
        assert_eq!(
            action(&r, "edit_file", path("secrets/deep/k")).0,
            Action::Deny
        );
    }

    #[test]
    fn a_rule_over_a_directory_covers_everything_inside_it() {
        let r = rules(json!({"deny": ["read_file(private)"], "default": "allow"}));
        assert_eq!(
            action(&r, "read_file", path("private/a/b.txt")).0,
            Action::Deny
        );
        assert_eq!(
            action(&r, "read_file", path("x/private/b.txt")).0,
            Action::Deny
        );
        assert_eq!(
            action(&r, "read_file", path("privateer.txt")).0,
            Action::Allow
        );
    }

    #[test]
    fn bash_rules_match_exact_commands_and_the_prefix_form() {
        let r = rules(json!({
            "allow": ["bash(git status)", "bash(git log:*)"],
            "deny": ["bash(rm:*)"],
            "default": "deny"
        }));
        assert_eq!(action(&r, "bash", cmd("git status")).0, Action::Allow);
        assert_eq!(action(&r, "bash", cmd("git status -s")).0, Action::Deny);
        assert_eq!(action(&r, "bash", cmd("git log")).0, Action::Allow);
        assert_eq!(
            action(&r, "bash", cmd("git log --oneline -3")).0,
            Action::Allow
        );
        assert_eq!(action(&r, "bash", cmd("git logx")).0, Action::Deny);
        let (a, rule) = action(&r, "bash", cmd("rm -rf /"));
        assert_eq!((a, rule.as_deref()), (Action::Deny, Some("bash(rm:*)")));
    }

    #[test]
    fn compound_commands_never_ride_on_an_allow_rule_and_cannot_hide_from_a_deny_rule() {
        let r = rules(json!({
            "allow": ["bash(git log:*)"],
            "deny": ["bash(rm:*)"],
            "default": "ask"
        }));
        for sneaky in [
            "git log; curl x | sh",
            "git log && echo",
            "git log $(id)",
            "git log > f",
        ] {
            assert_eq!(action(&r, "bash", cmd(sneaky)).0, Action::Ask, "{sneaky}");
        }
        for hidden in [
            "echo hi; rm -rf x",
            "true && rm x",
            "echo $(rm x)",
            "ls | rm y",
        ] {
            assert_eq!(action(&r, "bash", cmd(hidden)).0, Action::Deny, "{hidden}");
        }
    }

    #[test]
    fn a_deny_rule_holds_through_compound_syntax_wrappers_and_eval() {
        let r = rules(json!({"deny": ["bash(rm:*)"], "default": "allow"}));
        for bypass in [
            "{ rm v; }",
            "if true; then rm v; fi",
            "for i in 1; do rm v; done",
            "while rm v; do break; done",
            "! rm v",
            "time rm v",
            "<<<x rm v",
            "f() { rm v; }; f",
            "env rm v",
            "bash -c 'rm v'",
            "eval 'rm v'",
            "/bin/rm v",
            "\\rm v",
        ] {
            let v = r.decide("bash", cmd(bypass).as_ref());
            assert_eq!(v.action, Action::Deny, "{bypass}");
            assert_eq!(v.rule.map(Rule::text), Some("bash(rm:*)"));
        }
        // What cannot be read before it runs may be rm: asked about, never allowed.
        for hidden in [
            "rm${IFS}v",
            "$c v",
            "eval \"$x\"",
            "sh -c \"$x\"",
            "xargs rm < l",
            "source f",
        ] {
            let v = r.decide("bash", cmd(hidden).as_ref());
            assert_eq!(v.action, Action::Ask, "{hidden}");
            assert!(v.behind_deny && v.unseen.is_some(), "{hidden}: {v:?}");
        }
        assert_eq!(action(&r, "bash", cmd("ls -la")).0, Action::Allow);
        assert_eq!(action(&r, "bash", cmd("echo rm")).0, Action::Allow);
    }

    #[test]
    fn an_allow_rule_takes_pipelines_and_lists_of_allowed_commands_only() {
        let r = rules(json!({
            "allow": ["bash(git status)", "bash(git log:*)", "bash(grep:*)", "bash(wc:*)"],
            "default": "deny"
        }));
        for allowed in [
            "git status",
            "git  'status'",
            "git log --oneline | grep -v x | wc -l",
            "git status && git log -3 2>/dev/null",
            "git log $(git status)",
            "wc -l < notes.txt",
        ] {
            let v = r.decide("bash", cmd(allowed).as_ref());
            assert_eq!(v.action, Action::Allow, "{allowed}");
        }
        for refused in [
            "git status; ls",
            "git log | sh",
            "git log > out.txt",
            "GIT_PAGER=x git log",
            "git log $(rm x)",
            "$g status",
            "git() { rm x; }; git status",
        ] {
            let v = r.decide("bash", cmd(refused).as_ref());
            assert_eq!(v.action, Action::Deny, "{refused}");
        }
        // A bare rule allows every command of its tool, readable or not.
        let bare = rules(json!({"allow": ["bash"], "default": "deny"}));
        assert_eq!(action(&bare, "bash", cmd("eval \"$x\"")).0, Action::Allow);
    }

    #[test]
    fn mcp_names_take_a_star() {
        let r = rules(json!({"deny": ["mcp__github__*"], "allow": ["mcp__*"], "default": "deny"}));
        assert_eq!(
            action(&r, "mcp__github__create_issue", None).0,
            Action::Deny
        );
        assert_eq!(action(&r, "mcp__fs__read", None).0, Action::Allow);
        assert_eq!(action(&r, "bash", cmd("ls")).0, Action::Deny);
    }

    #[test]
    fn deny_beats_ask_beats_allow_beats_the_default() {
        let r = rules(json!({
            "allow": ["read_file", "write_file", "glob"],
            "ask": ["read_file", "write_file"],
            "deny": ["read_file"],
            "default": "deny"
        }));
        assert_eq!(action(&r, "read_file", path("a")).0, Action::Deny);
        assert_eq!(action(&r, "write_file", path("a")).0, Action::Ask);
        assert_eq!(action(&r, "glob", None).0, Action::Allow);
        assert_eq!(action(&r, "bash", None), (Action::Deny, None));
        let absent = rules(json!({}));
        assert_eq!(action(&absent, "bash", None), (Action::Ask, None));
    }

    #[test]
    fn claude_code_tool_names_are_understood() {
        let r = rules(json!({"deny": ["Edit(**/*.lock)", "Bash(curl:*)"], "default": "allow"}));
        assert_eq!(action(&r, "write_file", path("Cargo.lock")).0, Action::Deny);
        assert_eq!(action(&r, "edit_file", path("a/yarn.lock")).0, Action::Deny);
        assert_eq!(action(&r, "bash", cmd("curl http://x")).0, Action::Deny);
    }

    #[test]
    fn a_pattern_rule_never_matches_a_call_without_a_subject() {
        let r = rules(json!({"deny": ["mytool(x)"], "default": "allow"}));
        assert_eq!(action(&r, "mytool", None).0, Action::Allow);
    }

    #[test]
    fn a_bad_rule_is_an_error_that_names_it() {
        for (v, needle) in [
            (
                json!({"allow": ["read_file(src/[)"]}),
                "bad rule \"read_file(src/[)\"",
            ),
            (json!({"deny": ["bash(ls"]}), "bad rule \"bash(ls\""),
            (json!({"deny": ["bash()"]}), "bad rule \"bash()\""),
            (json!({"deny": ["rm -rf"]}), "bad rule \"rm -rf\""),
            (json!({"deny": [3]}), "permissions.deny: 3"),
            (json!({"allow": "bash"}), "permissions.allow"),
            (json!({"default": "maybe"}), "permissions.default"),
            (json!({"alow": []}), "permissions.alow"),
        ] {
            let err = Rules::from_json(&v).unwrap_err().to_string();
            assert!(err.contains(needle), "{err} should contain {needle}");
        }
    }
}
