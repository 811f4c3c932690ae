//! `policy`: the one layer that decides, for every validated call, whether it runs, with which
//! arguments, and records what happened. (`links.rs`: the other names of a hard-linked file, so
//! that a deny rule on a path holds for all of them.)
//!
//! ```text
//!             ┌──────────── Policy::decide ────────────┐                       Policy::finish
//! call ─► subject (confined path / command) ─► PreToolUse hooks ─► rules ─► [ask ─► Approver] ─► caps … handler … ─► PostToolUse hooks ─► audit line, metrics
//!                                              (allow / deny / rewrite ─► schema again)   (timeout → deny, cancel → cancelled)
//! ```
//!
//! The engine holds at most one [`Policy`], shared by every session; it travels beside each
//! turn's [`crate::SessionScope`] in the per-call environment (tools see the scope, never the
//! policy); `execute` enters it in one place, before the concurrency caps, so a
//! call waiting for an approval or an external hook holds no worker and no place. An engine
//! without a policy pays one `Option` check per call.
//!
//! Decision order: the tool's subject is confined first (a path that escapes the workspace is
//! refused here exactly as the tool would refuse it), then the `PreToolUse` hooks run in order —
//! in-process closures, then external commands — each may deny (the first denial wins), replace
//! the arguments (validated against the schema again: `invalid_arguments` if they do not fit) or
//! allow (skips an `ask`); then the rules decide on the final arguments: a deny rule always wins,
//! an ask rule asks unless a hook allowed, allow rules and the default apply last.

mod approval;
mod audit;
mod hooks;
mod links;
pub(crate) mod rules;

use std::path::{Component, Path};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::metrics::PolicyMetrics;
use crate::protocol::{ErrorCode, ToolCall, ToolDispatchResult};
use crate::registry::RegisteredTool;
use crate::tool::{Access, Mode, Resource, SessionScope, ToolError, access_of};
use crate::workspace::Workspace;

pub use approval::{Approval, ApprovalRequest, Approvals, Approver, RefuseAll, TerminalApprover};
pub use audit::AuditLog;
pub use hooks::{
    External, ExternalHooks, Hook, HookPlace, PostAction, PostToolUse, PreDecision, PreToolUse,
    Reply,
};
pub use rules::{Action, Confined, PolicyError, Rule, RuleIndex, Rules, Subject, Verdict};

/// Default wait for an approval before the call is denied.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The policy of an engine: rules, hooks, approver, audit log.
#[derive(Clone)]
pub struct Policy {
    rules: Arc<Rules>,
    hooks: Vec<Hook>,
    external: Arc<hooks::ExternalHooks>,
    approver: Arc<dyn Approver>,
    approval_timeout: Duration,
    audit: Option<AuditLog>,
    metrics: PolicyMetrics,
    /// Whether any call could wait (an ask rule or default, an external hook).
    may_wait: bool,
    /// A session's own stricter rules ([`Policy::narrowed`]).
    narrowing: Option<Arc<Narrowing>>,
}

/// A session's own rules: they may deny what the policy allows, never allow what it denies.
#[derive(Debug)]
struct Narrowing {
    name: Arc<str>,
    rules: Rules,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("rules", &self.rules.len())
            .field("hooks", &self.hooks)
            .field("external_pre", &self.external.pre.len())
            .field("external_post", &self.external.post.len())
            .field("audit", &self.audit.is_some())
            .field("narrowed_by", &self.narrowing.as_ref().map(|n| &n.name))
            .finish()
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::from_parts(Rules::allow_all(), hooks::ExternalHooks::default())
    }
}

impl Policy {
    /// No rules (every call allowed), no hooks: add hooks or an audit log to it.
    pub fn allow_all() -> Policy {
        Policy::default()
    }

    fn from_parts(rules: Rules, external: hooks::ExternalHooks) -> Policy {
        let mut policy = Policy {
            rules: Arc::new(rules),
            hooks: Vec::new(),
            external: Arc::new(external),
            approver: Arc::new(RefuseAll),
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            audit: None,
            metrics: PolicyMetrics::new(),
            may_wait: false,
            narrowing: None,
        };
        policy.refresh();
        policy
    }

    fn refresh(&mut self) {
        self.may_wait = !self.external.is_empty() || self.rules.has_ask();
    }

    /// A policy from a file's JSON: `{"permissions": {…}, "hooks": {…}}` (both optional; other
    /// keys of a Claude Code settings file are ignored).
    pub fn from_json(v: &Value) -> Result<Policy, PolicyError> {
        if !v.is_object() {
            return Err(PolicyError::new("a policy file must hold a JSON object"));
        }
        let rules = match v.get("permissions") {
            Some(p) => Rules::from_json(p)?,
            None => Rules::allow_all(),
        };
        let external = match v.get("hooks") {
            Some(h) => hooks::ExternalHooks::from_json(h)?,
            None => hooks::ExternalHooks::default(),
        };
        Ok(Policy::from_parts(rules, external))
    }

    /// Reads a policy file; the error names the file and the rule at fault.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            PolicyError::with_source(format!("cannot read policy {}", path.display()), e)
        })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            PolicyError::with_source(format!("policy {}: not JSON", path.display()), e)
        })?;
        Policy::from_json(&v).map_err(|e| e.within(&format!("policy {}", path.display())))
    }

    /// This policy, narrowed for one session by `rules` (named `name` in denials and audit
    /// lines): a call runs only if both allow it — the session's deny rules and default deny what
    /// this policy allows; its allow rules never allow what this policy denies or asks about.
    /// Everything else (hooks, approver, audit log) is shared. Rules that ask are refused: a
    /// session narrows by denying.
    pub fn narrowed(&self, name: impl Into<Arc<str>>, rules: Rules) -> Result<Policy, PolicyError> {
        let name = name.into();
        if rules.has_ask() {
            return Err(PolicyError::new(format!(
                "session policy {name}: a session's rules may allow and deny, not ask (without \
                 \"default\" the default is ask: give \"default\": \"allow\" or \"deny\")"
            )));
        }
        let mut narrowed = self.clone();
        narrowed.narrowing = Some(Arc::new(Narrowing { name, rules }));
        Ok(narrowed)
    }

    /// The name of the session rules this policy is narrowed by, if any.
    pub fn narrowed_by(&self) -> Option<&str> {
        self.narrowing.as_ref().map(|n| &*n.name)
    }

    /// Adds an in-process hook (run in the order added, before external hooks).
    pub fn hook(mut self, hook: Hook) -> Policy {
        self.hooks.push(hook);
        self
    }

    /// Who answers `ask` (default: [`RefuseAll`]).
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Policy {
        self.approver = approver;
        self
    }

    /// How long an approval is waited for before the call is denied (default 60 s).
    pub fn approval_timeout(mut self, timeout: Duration) -> Policy {
        self.approval_timeout = timeout;
        self
    }

    /// Writes one audit line per call to `log`.
    pub fn audit(mut self, log: AuditLog) -> Policy {
        self.audit = Some(log.with_metrics(self.metrics.clone()));
        self
    }

    /// True when `Policy::finish` reads a call's arguments (an audit log, a PostToolUse
    /// hook); otherwise they are not kept.
    pub fn reads_args(&self) -> bool {
        self.audit.is_some()
            || !self.external.post.is_empty()
            || self.hooks.iter().any(|h| matches!(h, Hook::Post(..)))
    }

    /// The audit log, if any.
    pub fn audit_log(&self) -> Option<&AuditLog> {
        self.audit.as_ref()
    }

    /// The external hooks (tests reach a persistent hook's process through them).
    pub fn external_hooks(&self) -> &hooks::ExternalHooks {
        &self.external
    }

    /// True when a call of `tool` may have to wait (an approval, an external hook before or
    /// after it): such calls never run in place, even with an inline handler.
    pub fn waits_for(&self, tool: &str) -> bool {
        self.may_wait && (self.rules.may_ask(tool) || self.external.any_for(tool))
    }

    /// [`Policy::waits_for`] of a registered tool, worked out on its first call and kept in its
    /// rule index ([`RegisteredTool::policy_rules`]).
    pub(crate) fn waits_for_tool(&self, tool: &RegisteredTool) -> bool {
        if !self.may_wait {
            return false;
        }
        match self.index(tool) {
            Some(index) => index.waits.unwrap_or_else(|| self.waits_for(&tool.name)),
            None => self.waits_for(&tool.name),
        }
    }

    /// The tool's rule index, made by these rules on first use (`None` if another policy's rules
    /// made it, e.g. a tool shared by engines with different policies).
    fn index<'t>(&self, tool: &'t RegisteredTool) -> Option<&'t RuleIndex> {
        let index = tool.policy_rules.get_or_init(|| {
            let mut index = self.rules.index_for(&tool.name);
            index.waits = Some(self.waits_for(&tool.name));
            index
        });
        self.rules.owns(index).then_some(index)
    }

    /// Decides a call that cannot wait ([`Policy::waits_for`] is false): rules and in-process
    /// hooks only.
    pub(crate) fn decide_now(
        &self,
        call: &mut ToolCall,
        tool: &RegisteredTool,
        scope: &SessionScope,
    ) -> Result<Ticket, Box<Refused>> {
        // The clock is read only for the audit line's duration (a clock read costs ~30 ns here).
        let started = self.audit.is_some().then(Instant::now);
        let mut ticket = self.pre_hooks(call, tool, scope, started)?;
        self.judge(call, tool, scope, &mut ticket)?;
        match ticket.pending_ask.take() {
            None => Ok(ticket),
            Some(ask) => Err(self.refuse(
                ticket,
                ToolError::permission(format!(
                    "{}: needs approval, and this call cannot wait for one",
                    ask.what
                )),
                "refused",
            )),
        }
    }

    /// Decides a call: hooks, rules and, for `ask`, the approver (bounded by the approval
    /// timeout; `cancelled` if `cancel` fires first).
    pub(crate) async fn decide(
        &self,
        call: &mut ToolCall,
        tool: &RegisteredTool,
        scope: &SessionScope,
        cancel: &CancellationToken,
    ) -> Result<Ticket, Box<Refused>> {
        // The clock is read only for the audit line's duration (a clock read costs ~30 ns here).
        let started = self.audit.is_some().then(Instant::now);
        let mut ticket = self.pre_hooks(call, tool, scope, started)?;
        for hook in self.external.pre.iter().filter(|h| h.matches(&tool.name)) {
            let input = json!({
                "hook_event_name": "PreToolUse",
                "session_id": scope.id(),
                "tool_name": &*tool.name,
                "tool_input": &call.arguments,
                "tool_use_id": &*call.id,
                "cwd": scope.workspace().map(|w| w.root().display().to_string()),
            });
            let place = hooks::HookPlace {
                workspace: scope.workspace().map(Workspace::root),
            };
            let decision = tokio::select! {
                d = hook.run(&input, place) => d,
                () = cancel.cancelled() => {
                    return Err(self.refuse(ticket, ToolError::new(ErrorCode::Cancelled, "cancelled while a hook was deciding"), "refused"));
                }
            };
            self.apply_pre(call, tool, scope, &mut ticket, &hook.label, decision)?;
        }
        self.judge(call, tool, scope, &mut ticket)?;
        let Some(PendingAsk { rule, what }) = ticket.pending_ask.take() else {
            return Ok(ticket);
        };
        let request = ApprovalRequest {
            approval_id: String::new(),
            session_id: scope.id().to_string(),
            tool_use_id: call.id.to_string(),
            tool_name: tool.name.to_string(),
            tool_input: call.arguments.clone(),
            subject: ticket.subject.clone(),
            rule: rule.clone(),
        };
        let asked = self.approver.approve(request);
        let answer = tokio::select! {
            a = asked => a,
            () = tokio::time::sleep(self.approval_timeout) => Err(format!(
                "no approval within {} s", self.approval_timeout.as_secs_f64()
            )),
            () = cancel.cancelled() => {
                return Err(self.refuse(ticket, ToolError::new(ErrorCode::Cancelled, "cancelled while waiting for approval"), "refused"));
            }
        };
        ticket.by = By::Approver;
        match answer {
            Ok(()) => {
                ticket.decision = "approved";
                Ok(ticket)
            }
            Err(reason) => Err(self.refuse(
                ticket,
                ToolError::permission(format!("{what}: {reason}")),
                "refused",
            )),
        }
    }

    fn pre_hooks(
        &self,
        call: &mut ToolCall,
        tool: &RegisteredTool,
        scope: &SessionScope,
        started: Option<Instant>,
    ) -> Result<Ticket, Box<Refused>> {
        let mut ticket = Ticket {
            started,
            decision: "allow",
            by: By::Default,
            subject: None,
            hook_allowed: false,
            pending_ask: None,
        };
        for hook in &self.hooks {
            let Hook::Pre(name, f) = hook else { continue };
            let decision = f(&PreToolUse {
                session_id: scope.id(),
                tool_name: &tool.name,
                tool_use_id: &call.id,
                tool_input: &call.arguments,
            });
            self.apply_pre(call, tool, scope, &mut ticket, name, decision)?;
        }
        Ok(ticket)
    }

    fn apply_pre(
        &self,
        call: &mut ToolCall,
        tool: &RegisteredTool,
        scope: &SessionScope,
        ticket: &mut Ticket,
        by: &Arc<str>,
        decision: PreDecision,
    ) -> Result<(), Box<Refused>> {
        match decision {
            PreDecision::Continue => Ok(()),
            PreDecision::Allow => {
                ticket.hook_allowed = true;
                ticket.by = By::Label(Arc::clone(by));
                Ok(())
            }
            PreDecision::Deny(reason) => {
                ticket.by = By::Label(Arc::clone(by));
                let t = std::mem::replace(ticket, Ticket::placeholder());
                Err(self.refuse(
                    t,
                    ToolError::permission(format!("denied by {by}: {reason}")),
                    "deny",
                ))
            }
            PreDecision::Rewrite(args) => {
                if let Err(detail) = crate::validation::check(&tool.validator, &args) {
                    ticket.by = By::Label(Arc::clone(by));
                    let t = std::mem::replace(ticket, Ticket::placeholder());
                    return Err(self.refuse(
                        t,
                        ToolError::invalid(format!("arguments rewritten by {by}: {detail}")),
                        "deny",
                    ));
                }
                // The call's place in the turn's conflict graph was planned from the arguments
                // it had; rewritten ones may touch only what those did.
                let ws = scope.workspace();
                let access = |a: &Value| {
                    access_of(tool.access.as_ref(), tool.policy.concurrency_safe, a, ws)
                };
                if let Err(beyond) = within(&access(&call.arguments), &access(&args)) {
                    ticket.by = By::Label(Arc::clone(by));
                    let t = std::mem::replace(ticket, Ticket::placeholder());
                    return Err(self.refuse(
                        t,
                        ToolError::permission(format!(
                            "arguments rewritten by {by} would {beyond}, which the call as planned \
                             does not; a hook may not change what a call touches (the turn's \
                             order was planned from the model's arguments)"
                        )),
                        "deny",
                    ));
                }
                call.arguments = args;
                ticket.by = By::Label(Arc::clone(by));
                Ok(())
            }
        }
    }

    /// The rules, on the final arguments.
    fn judge(
        &self,
        call: &ToolCall,
        tool: &RegisteredTool,
        scope: &SessionScope,
        ticket: &mut Ticket,
    ) -> Result<(), Box<Refused>> {
        let subject = match tool.subject.as_ref().and_then(|f| f.of(&call.arguments)) {
            None => None,
            Some(Subject::Command(c)) => Some(Confined::Command(c)),
            Some(Subject::Path(p)) => match confine(scope.workspace(), &p) {
                Ok(path) => Some(Confined::Path(path)),
                Err(e) => {
                    ticket.by = By::Workspace;
                    ticket.subject = Some(audit::truncate(&p, audit::SUBJECT_CAP));
                    let t = std::mem::replace(ticket, Ticket::placeholder());
                    return Err(self.refuse(t, e, "deny"));
                }
            },
        };
        ticket.subject = subject
            .as_ref()
            .map(|s| audit::truncate(s.text(), audit::SUBJECT_CAP));
        if let Some(Confined::Path(path)) = &subject
            && let Some(ws) = scope.workspace()
            && let Some(detail) = self.denied_by_another_name(tool, ws, path)
        {
            ticket.by = By::Rule;
            let t = std::mem::replace(ticket, Ticket::placeholder());
            return Err(self.refuse(t, ToolError::permission(detail), "deny"));
        }
        if let Some(narrowing) = &self.narrowing
            && let verdict = narrowing.rules.decide(&tool.name, subject.as_ref())
            && verdict.action != Action::Allow
        {
            // A session's rules cannot ask: one that may match what it cannot read denies.
            let rule = verdict.rule;
            let detail = match (rule, &verdict.unseen) {
                (Some(r), Some(why)) => format!(
                    "rule \"{}\" of the session's policy {} cannot read all of this command \
                     ({why}), so it denies it",
                    r.text(),
                    narrowing.name
                ),
                (Some(r), None) => format!(
                    "denied by rule \"{}\" of the session's policy {}",
                    r.text(),
                    narrowing.name
                ),
                (None, _) => format!(
                    "denied by the default of the session's policy {}",
                    narrowing.name
                ),
            };
            ticket.by = match rule {
                Some(r) if self.audit.is_some() => By::Label(Arc::clone(r.label())),
                Some(_) => By::Rule,
                None => By::Default,
            };
            let t = std::mem::replace(ticket, Ticket::placeholder());
            return Err(self.refuse(t, ToolError::permission(detail), "deny"));
        }
        if self.rules.allows_everything() {
            return Ok(());
        }
        let verdict = match self.index(tool) {
            Some(index) => self.rules.decide_among(index, &tool.name, subject.as_ref()),
            None => self.rules.decide(&tool.name, subject.as_ref()),
        };
        let (action, rule) = (verdict.action, verdict.rule);
        // The label (a shared Arc) only when an audit line will name it: cloning it on every call
        // would make every core write the same cache line.
        let by = match rule {
            None => By::Default,
            Some(r) if self.audit.is_some() => By::Label(Arc::clone(r.label())),
            Some(_) => By::Rule,
        };
        match action {
            Action::Allow => {
                if !ticket.hook_allowed {
                    ticket.by = by;
                }
                Ok(())
            }
            // A hook's allow skips an ask, but not one that stands in for a deny rule.
            Action::Ask if ticket.hook_allowed && !verdict.behind_deny => Ok(()),
            Action::Ask => {
                ticket.by = by;
                let what = match (rule, &verdict.unseen) {
                    (Some(r), Some(why)) => format!(
                        "rule \"{}\" cannot read all of this command ({why}), so it asks for \
                         approval",
                        r.text()
                    ),
                    (Some(r), None) => format!("rule \"{}\" asks for approval", r.text()),
                    (None, _) => "the default asks for approval".to_string(),
                };
                ticket.pending_ask = Some(PendingAsk {
                    rule: rule.map(|r| r.text().to_string()),
                    what,
                });
                Ok(())
            }
            Action::Deny => {
                let detail = match rule {
                    Some(r) => format!("denied by rule \"{}\"", r.text()),
                    None => "denied by the policy's default".to_string(),
                };
                ticket.by = by;
                let t = std::mem::replace(ticket, Ticket::placeholder());
                Err(self.refuse(t, ToolError::permission(detail), "deny"))
            }
        }
    }

    /// With hard links allowed in the workspace, a deny rule on a path holds for every name of
    /// that file in the workspace: when `path` is a regular file with more than one link and a
    /// deny rule of this tool's has a path pattern, the workspace is searched for the file's other
    /// names and the call is denied if a rule denies one of them (or if the search cannot finish).
    fn denied_by_another_name(
        &self,
        tool: &RegisteredTool,
        ws: &Workspace,
        path: &str,
    ) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        if !ws.hard_links_allowed() {
            return None; // the readers refuse multiply-linked files themselves
        }
        let sets: Vec<&Rules> = std::iter::once(&*self.rules)
            .chain(self.narrowing.as_ref().map(|n| &n.rules))
            .filter(|r| r.denies_paths_of(&tool.name))
            .collect();
        if sets.is_empty() {
            return None;
        }
        let meta = std::fs::metadata(ws.root().join(path)).ok()?;
        if !meta.is_file() || meta.nlink() < 2 {
            return None;
        }
        let names = match links::other_names(ws.root(), meta.dev(), meta.ino()) {
            Ok(names) => names,
            Err(why) => {
                return Some(format!(
                    "{path} is a hard-linked file and deny rules hold for every name of a file, \
                     but its other names cannot be found ({why})"
                ));
            }
        };
        sets.iter().find_map(|rules| {
            rules.denies_any(&tool.name, &names).map(|(rule, name)| {
                format!(
                    "denied by rule \"{}\": {path} is another name (a hard link) of {name}",
                    rule.text()
                )
            })
        })
    }

    fn refuse(&self, mut ticket: Ticket, error: ToolError, decision: &'static str) -> Box<Refused> {
        ticket.decision = decision;
        Box::new(Refused { ticket, error })
    }

    /// After a call that could not wait (it ran in place): in-process `PostToolUse` hooks, then
    /// the audit line and the decision metric. External `PostToolUse` hooks need
    /// [`Policy::finish_waiting`] (a call one of them matches never runs in place).
    pub(crate) fn finish(
        &self,
        ticket: &Ticket,
        scope: &SessionScope,
        tool: &RegisteredTool,
        args: Option<&Value>,
        result: &mut ToolDispatchResult,
    ) {
        let args = args.unwrap_or(&Value::Null);
        if ticket.ran() {
            self.post_in_process(scope, tool, args, result);
        }
        self.record(ticket, scope, tool, args, result);
    }

    /// After a call: in-process `PostToolUse` hooks, then the file's external ones, then the
    /// audit line and the decision metric. The call already ran: a hook that fails, hangs past
    /// its timeout or is cut short by the turn's cancellation leaves the result (and its code)
    /// as it was, with a line saying so appended.
    pub(crate) async fn finish_waiting(
        &self,
        ticket: &Ticket,
        scope: &SessionScope,
        tool: &RegisteredTool,
        args: Option<&Value>,
        cancel: &CancellationToken,
        result: &mut ToolDispatchResult,
    ) {
        let args = args.unwrap_or(&Value::Null);
        if ticket.ran() {
            self.post_in_process(scope, tool, args, result);
            for hook in self.external.post.iter().filter(|h| h.matches(&tool.name)) {
                let input = json!({
                    "hook_event_name": "PostToolUse",
                    "session_id": scope.id(),
                    "tool_name": &*tool.name,
                    "tool_input": args,
                    "tool_response": {
                        "content": &result.content,
                        "is_error": result.error.is_some(),
                        "error_code": result.error.map(|c| c.as_str()),
                    },
                    "tool_use_id": &*result.tool_use_id,
                    "cwd": scope.workspace().map(|w| w.root().display().to_string()),
                });
                let place = hooks::HookPlace {
                    workspace: scope.workspace().map(Workspace::root),
                };
                let (reply, cancelled) = tokio::select! {
                    biased;
                    () = cancel.cancelled() => (hooks::Reply::Failed(format!(
                        "{} was stopped: the turn was cancelled", hook.label
                    )), true),
                    r = hook.reply(&input, place) => (r, false),
                };
                if let hooks::Reply::Failed(what) = &reply {
                    tracing::warn!(hook = %hook.label, tool_use_id = %result.tool_use_id, "PostToolUse hook failed: {what}");
                }
                for action in hooks::post_actions(&hook.label, reply) {
                    hooks::apply_post(result, action);
                }
                if cancelled {
                    break;
                }
            }
        }
        self.record(ticket, scope, tool, args, result);
    }

    fn post_in_process(
        &self,
        scope: &SessionScope,
        tool: &RegisteredTool,
        args: &Value,
        result: &mut ToolDispatchResult,
    ) {
        for hook in &self.hooks {
            let Hook::Post(_, f) = hook else { continue };
            let action = f(&PostToolUse {
                session_id: scope.id(),
                tool_name: &tool.name,
                tool_use_id: &result.tool_use_id,
                tool_input: args,
                result,
            });
            hooks::apply_post(result, action);
        }
    }

    /// The audit line of a call answered before the policy saw it — refused at admission (an
    /// unknown tool, invalid arguments, a duplicate id) or cancelled before it started — so the
    /// log holds one line per call whatever answered it: `decision` `none`, `by` who answered
    /// (`admission`, `cancellation`). No decision metric: the policy decided nothing.
    pub(crate) fn record_unanswered(
        &self,
        scope: &SessionScope,
        call: (&str, &str),
        args: &Value,
        by: &'static str,
        code: ErrorCode,
    ) {
        let Some(log) = &self.audit else { return };
        let (id, tool) = call;
        log.record(&audit::AuditLine {
            time: audit::now_rfc3339(),
            session: scope.id().to_string(),
            tool_use_id: audit::truncate(id, audit::SUBJECT_CAP),
            tool: audit::truncate(tool, audit::SUBJECT_CAP),
            subject: None,
            decision: "none",
            by: by.to_string(),
            outcome: code.as_str(),
            duration_ms: 0.0,
            args_sha256: audit::sha256_hex(args),
            args: log.with_args().then(|| args.clone()),
        });
    }

    /// The decision metric and the audit line.
    fn record(
        &self,
        ticket: &Ticket,
        scope: &SessionScope,
        tool: &RegisteredTool,
        args: &Value,
        result: &ToolDispatchResult,
    ) {
        self.metrics
            .decision(&tool.policy_decisions, &tool.name, ticket.decision);
        if let Some(log) = &self.audit {
            log.record(&audit::AuditLine {
                time: audit::now_rfc3339(),
                session: scope.id().to_string(),
                tool_use_id: result.tool_use_id.to_string(),
                tool: tool.name.to_string(),
                subject: ticket.subject.clone(),
                decision: ticket.decision,
                by: ticket.by.as_str().to_string(),
                outcome: result.error.map_or("ok", |c| c.as_str()),
                duration_ms: ticket
                    .started
                    .map_or(0.0, |s| s.elapsed().as_secs_f64() * 1e3),
                args_sha256: audit::sha256_hex(args),
                args: log.with_args().then(|| args.clone()),
            });
        }
    }
}

/// What the policy decided about one call (carried to `Policy::finish`).
#[derive(Debug)]
pub struct Ticket {
    /// When the policy started on the call (only with an audit log, which reports the duration).
    started: Option<Instant>,
    /// `allow`, `deny`, `approved`, `refused`.
    pub decision: &'static str,
    /// What decided: `rule:…`, `hook:…`, `approver`, `default`, `workspace`.
    pub by: By,
    /// The confined subject, truncated for the audit log.
    pub subject: Option<String>,
    hook_allowed: bool,
    /// An ask still to be answered.
    pending_ask: Option<PendingAsk>,
}

/// An ask still to be answered: the rule that asks (`None`: the default), and the refusal's
/// first words if nobody approves.
#[derive(Debug)]
struct PendingAsk {
    rule: Option<String>,
    what: String,
}

impl Ticket {
    /// True when the policy let the call run (`PostToolUse` hooks see only such calls).
    fn ran(&self) -> bool {
        matches!(self.decision, "allow" | "approved")
    }

    fn placeholder() -> Ticket {
        Ticket {
            started: None,
            decision: "deny",
            by: By::Default,
            subject: None,
            hook_allowed: false,
            pending_ask: None,
        }
    }
}

/// What made a decision (the audit line's `by`).
#[derive(Debug, Clone)]
pub enum By {
    /// The rules' default.
    Default,
    /// The approver's answer.
    Approver,
    /// The workspace refused the path (as the tool would).
    Workspace,
    /// A rule, not named (nothing records it: the policy has no audit log).
    Rule,
    /// A rule (`rule:TEXT`) or a hook (`hook:NAME`).
    Label(Arc<str>),
}

impl By {
    /// As written in the audit log.
    pub fn as_str(&self) -> &str {
        match self {
            By::Default => "default",
            By::Approver => "approver",
            By::Workspace => "workspace",
            By::Rule => "rule",
            By::Label(l) => l,
        }
    }
}

/// A call the policy refused: its answer, and the ticket for the audit line.
#[derive(Debug)]
pub struct Refused {
    /// What decided.
    pub ticket: Ticket,
    /// The call's answer.
    pub error: ToolError,
}

/// `Ok` when a call with access `new` conflicts with nothing a call with `planned` does not:
/// every resource of `new` is one of `planned`'s or lies inside one (a path under a planned
/// directory), in a mode no stronger (a planned read does not cover a write). `Err` says what
/// `new` touches beyond (`write "b.txt"`). An exclusive plan covers everything.
pub(crate) fn within(planned: &Access, new: &Access) -> Result<(), String> {
    let (planned, new) = match (planned, new) {
        (Access::Exclusive, _) => return Ok(()),
        (Access::Set(_), Access::Exclusive) => {
            return Err("run exclusive (conflict with every call)".into());
        }
        (Access::Set(p), Access::Set(n)) => (p, n),
    };
    let inside = |r: &Resource, outer: &Resource| match (r, outer) {
        (Resource::Path(a), Resource::Path(b)) => b == Path::new(".") || a.starts_with(b),
        (Resource::Named(a), Resource::Named(b)) => a == b,
        _ => false,
    };
    for (r, m) in new {
        let covered = planned
            .iter()
            .any(|(pr, pm)| inside(r, pr) && (*m == Mode::Read || *pm == Mode::Write));
        if !covered {
            let verb = match m {
                Mode::Read => "read",
                Mode::Write => "write",
            };
            let what = match r {
                Resource::Path(p) => format!("\"{}\"", p.display()),
                Resource::Named(n) => format!("resource \"{n}\""),
            };
            return Err(format!("{verb} {what}"));
        }
    }
    Ok(())
}

/// The workspace-relative path a file tool would touch: `..` and escaping absolute paths are
/// refused as the tool refuses them, and symlinks inside the workspace are followed, so a rule
/// sees the file really touched. A path whose target does not exist yet is resolved as far as it
/// exists. Without a workspace the path is only normalised.
pub fn confine(workspace: Option<&Workspace>, path: &str) -> Result<String, ToolError> {
    let Some(ws) = workspace else {
        return Ok(slashed(Path::new(path.trim_start_matches("./"))));
    };
    let rel = ws.relative(path)?;
    let root = ws.root();
    let full = root.join(&rel);
    // The deepest existing ancestor, canonicalised, plus the rest as written.
    let mut existing = full.as_path();
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    let resolved = loop {
        match std::fs::canonicalize(existing) {
            Ok(c) => break Some(c),
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) if parent.starts_with(root) => {
                    rest.push(name);
                    existing = parent;
                }
                _ => break None,
            },
        }
    };
    let Some(mut real) = resolved else {
        return Ok(slashed(&rel));
    };
    for name in rest.into_iter().rev() {
        real.push(name);
    }
    match real.strip_prefix(root) {
        Ok(inside) if inside.as_os_str().is_empty() => Ok(".".into()),
        Ok(inside) => Ok(slashed(inside)),
        Err(_) => Err(ToolError::permission(format!(
            "path escapes workspace: {path}"
        ))),
    }
}

fn slashed(p: &Path) -> String {
    let parts: Vec<String> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_file_that_cannot_be_used_names_it_and_keeps_the_cause() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        let e = Policy::load(&missing).unwrap_err();
        assert_eq!(
            e.what(),
            format!("cannot read policy {}", missing.display())
        );
        let io = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the I/O error is the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert!(e.to_string().starts_with(e.what()), "{e}");
        let not_json = dir.path().join("p.json");
        std::fs::write(&not_json, "{").unwrap();
        let e = Policy::load(&not_json).unwrap_err();
        assert!(
            std::error::Error::source(&e)
                .is_some_and(|s| s.downcast_ref::<serde_json::Error>().is_some())
        );
        std::fs::write(&not_json, r#"{"permissions": {"allow": ["Bash(("]}}"#).unwrap();
        let e = Policy::load(&not_json).unwrap_err();
        assert!(
            e.what().starts_with(&format!(
                "policy {}: permissions.allow: bad rule",
                not_json.display()
            )),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_none());
    }

    fn p(s: &str) -> Resource {
        Resource::Path(std::path::PathBuf::from(s))
    }

    #[test]
    fn a_rewrite_may_narrow_what_a_call_touches_but_never_widen_it() {
        let planned = Access::write(p("a.txt"));
        assert_eq!(within(&planned, &Access::write(p("a.txt"))), Ok(()));
        assert_eq!(within(&planned, &Access::read(p("a.txt"))), Ok(()));
        assert_eq!(within(&planned, &Access::none()), Ok(()));
        assert_eq!(
            within(&planned, &Access::write(p("b.txt"))),
            Err("write \"b.txt\"".into())
        );
        assert!(within(&Access::read(p("a.txt")), &Access::write(p("a.txt"))).is_err());
        assert!(within(&Access::write(p("dir")), &Access::write(p("dir/x"))).is_ok());
        assert!(within(&Access::write(p("dir/x")), &Access::write(p("dir"))).is_err());
        assert!(within(&Access::write(Resource::root()), &Access::write(p("x/y"))).is_ok());
        assert!(within(&Access::Exclusive, &Access::write(p("x"))).is_ok());
        assert!(within(&planned, &Access::Exclusive).is_err());
        let db = Access::write(Resource::named("db:users"));
        assert!(within(&db, &Access::read(Resource::named("db:users"))).is_ok());
        assert!(within(&db, &Access::read(Resource::named("db:orders"))).is_err());
        assert!(within(&db, &Access::read(p("db:users"))).is_err());
    }
}
