//! The Registry actor owns every `ToolSpec` and its compiled validator; nothing else holds a mutable
//! copy.
//!
//! Messages (all answered here): [`Register`] → `Result<(), RegistryError>`, [`Unregister`] →
//! `bool`, [`ReplaceGroup`] (remove every tool whose name starts with a prefix and register a new
//! set, in one version bump) → `Vec<RegistryError>` (the specs refused), and [`GetSnapshot`] →
//! `Arc<Snapshot>`. Catalogs are made from a snapshot ([`Snapshot::catalog`]), shaped by what
//! it defers (see `deferral`) and by what the asking session has seen.
//!
//! The hot path does not ask the registry per turn: every change bumps a shared version number, and
//! the engine keeps one `Arc<Snapshot>` (in an `ArcSwap`) that a turn re-fetches only when that
//! number moved. Validators are compiled once, at registration.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use jsonschema::Validator;
use kameo::prelude::*;
use serde_json::{Value, json};

use crate::breaker::Breaker;
use crate::limiter::Limiter;
use crate::metrics::{EngineMetrics, ToolMetrics};
use crate::tool::{AccessFn, Defer, Handler, SessionScope, ToolPolicy, ToolSpec};
use crate::validation;

mod deferral;
pub mod search;
pub use deferral::{Deferral, DeferralConfig, TOOL_SEARCH};
use search::Part;

/// A registered tool: the spec as registered (the registry's own deep copy of the schema) plus its
/// compiled validator. Shared read-only through `Arc`.
#[derive(Debug)]
pub struct RegisteredTool {
    /// The tool name.
    pub name: Arc<str>,
    /// The description.
    pub description: String,
    /// The registry's own copy of the input schema.
    pub input_schema: Value,
    /// The implementation.
    pub handler: Handler,
    /// Concurrency safety, timeout, output cap.
    pub policy: ToolPolicy,
    /// What a call reads and writes, if the tool declares it.
    pub access: Option<AccessFn>,
    /// Compiled once at registration.
    pub validator: Validator,
    /// Metric handles of this tool's label, created once at registration.
    pub metrics: ToolMetrics,
    /// The per-tool concurrency cap, if the policy sets one.
    pub limiter: Option<Limiter>,
    /// Restart intensity: trips the tool after repeated panics.
    pub breaker: Breaker,
    /// What a call touches, for permission rules.
    pub subject: Option<crate::tool::SubjectOf>,
    /// The policy's decision counters of this tool, made on its first decision.
    pub policy_decisions: crate::metrics::DecisionCounters,
    /// The permission rules that name this tool, found on its first decision.
    pub policy_rules: std::sync::OnceLock<crate::policy::rules::RuleIndex>,
    /// Whether the catalog may defer it.
    pub defer: Defer,
    /// What running a call twice would do.
    pub effect: crate::tool::Effect,
    /// Bytes of its Anthropic catalog entry as JSON (for the catalog's size estimate).
    pub catalog_bytes: usize,
}

/// How many calls may wait for a tool's own concurrency cap before more are answered `overloaded`.
pub const TOOL_QUEUE_LIMIT: usize = 1024;

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The name is empty.
    #[error("tool name must not be empty")]
    EmptyName,
    /// The name does not match `^[a-zA-Z0-9_-]{1,64}$`.
    #[error("invalid tool name {0:?}: names must match ^[a-zA-Z0-9_-]{{1,64}}$")]
    InvalidName(String),
    /// A tool of that name is already registered.
    #[error("duplicate tool name: {0}")]
    Duplicate(String),
    /// The schema is not an object schema or does not compile.
    #[error("tool {name}: {detail}")]
    BadSchema {
        /// The tool.
        name: String,
        /// What is wrong with the schema.
        detail: String,
    },
    /// The registry actor is not running (the engine was shut down).
    #[error("registry unavailable: {0}")]
    Unavailable(String),
    /// Not a registration problem: the engine's sandbox mode cannot be enforced on this machine
    /// (reported by [`crate::EngineBuilder::build`]).
    #[error("{0}")]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// Not a registration problem: the engine's journal cannot be opened (reported by
    /// [`crate::EngineBuilder::build`]).
    #[error("{0}")]
    Journal(String),
}

/// True when `name` matches `^[a-zA-Z0-9_-]{1,64}$`.
pub fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An immutable view of the registry at one version.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The registry version this view was taken at.
    pub version: u64,
    tools: HashMap<Arc<str>, Arc<RegisteredTool>>,
    /// The tools in catalog order (without `tool_search`).
    order: Vec<Arc<RegisteredTool>>,
    /// The engine's metric handles (shared by every snapshot of one engine).
    pub metrics: Arc<EngineMetrics>,
    /// When `auto` tools are deferred.
    config: DeferralConfig,
    /// The search index of the engine's deferrable tools (`None`: it has none).
    part: Option<Arc<Part>>,
    /// What this view defers (`None`: nothing; then it has no `tool_search`).
    deferral: Option<Arc<Deferral>>,
}

impl Snapshot {
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    /// A snapshot of exactly these tools, registered with the registry's own checks (names,
    /// duplicates, schemas) but outside any engine: its metric handles record nothing. For the
    /// direct baseline and for tests of the planner and the layer stack.
    pub fn from_specs(
        specs: impl IntoIterator<Item = ToolSpec>,
    ) -> Result<Arc<Snapshot>, RegistryError> {
        crate::metrics::detached(|| {
            let mut registry =
                Registry::new(Arc::new(AtomicU64::new(0)), Arc::new(EngineMetrics::new()));
            registry.register_all(specs)?;
            Ok(registry.snapshot())
        })
    }

    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    /// Every tool of the snapshot, in no particular order.
    pub fn tools(&self) -> impl Iterator<Item = &Arc<RegisteredTool>> {
        self.tools.values()
    }

    /// The metric handles for a call to `name`: the tool's own, or the `_unknown` label's.
    pub fn tool_metrics(&self, name: &str) -> &ToolMetrics {
        self.tools
            .get(name)
            .map_or(&self.metrics.unknown, |t| &t.metrics)
    }
    /// This view with `extra` tools added (a session's own tools, `extra_part` the index of
    /// those of them that may be deferred): same version and metrics. An extra tool whose name
    /// the view already has takes that name's place in the new view. The view's deferral (and
    /// its `tool_search`) is decided anew over the whole catalog.
    pub fn extended(
        &self,
        extra: &[Arc<RegisteredTool>],
        extra_part: Option<&Arc<Part>>,
    ) -> Snapshot {
        let mut shadowed = HashSet::new();
        let mut order: Vec<Arc<RegisteredTool>> = self.order.clone();
        for t in extra {
            // The map also holds `tool_search`, which is not in `order`: filtering by the
            // shadowed names below is then a no-op for it.
            if self.tools.contains_key(&t.name) {
                shadowed.insert(Arc::clone(&t.name));
            }
        }
        if !shadowed.is_empty() {
            order.retain(|t| !shadowed.contains(&t.name));
        }
        order.extend(extra.iter().cloned());
        let parts: Vec<Arc<Part>> = self.part.iter().chain(extra_part).cloned().collect();
        // Part 0 is the engine's only when the engine has one.
        let shadowed = if self.part.is_some() {
            shadowed
        } else {
            HashSet::new()
        };
        Snapshot::assemble(
            self.version,
            order,
            Arc::clone(&self.metrics),
            self.config,
            self.part.clone(),
            parts,
            shadowed,
        )
    }

    /// A view of `order` (catalog order), its deferral decided over all of it; `parts` index
    /// its deferrable tools.
    fn assemble(
        version: u64,
        order: Vec<Arc<RegisteredTool>>,
        metrics: Arc<EngineMetrics>,
        config: DeferralConfig,
        part: Option<Arc<Part>>,
        parts: Vec<Arc<Part>>,
        shadowed: HashSet<Arc<str>>,
    ) -> Snapshot {
        let mut tools: HashMap<Arc<str>, Arc<RegisteredTool>> = order
            .iter()
            .map(|t| (Arc::clone(&t.name), Arc::clone(t)))
            .collect();
        let deferral = Deferral::of(&config, &order, parts, shadowed).map(Arc::new);
        if let Some(deferral) = &deferral {
            if tools.contains_key(TOOL_SEARCH) {
                tracing::warn!(
                    "a registered tool is named {TOOL_SEARCH}: the built-in search of deferred \
                     tools is left out (deferred tools can still be called by name)"
                );
            } else {
                let names: Arc<HashSet<Arc<str>>> = Arc::new(tools.keys().cloned().collect());
                let spec = deferral::tool_search(Arc::clone(deferral), names, Arc::clone(&metrics));
                // The spec is the engine's own; it always prepares.
                if let Ok(search) = prepare(spec) {
                    tools.insert(Arc::clone(&search.name), Arc::new(search));
                }
            }
        }
        Snapshot {
            version,
            tools,
            order,
            metrics,
            config,
            part,
            deferral,
        }
    }

    /// What this view defers, if anything.
    pub fn deferral(&self) -> Option<&Arc<Deferral>> {
        self.deferral.as_ref()
    }

    /// The index of the given tools' deferrable ones (`None`: none may be deferred).
    pub fn index(tools: &[Arc<RegisteredTool>]) -> Option<Arc<Part>> {
        let deferrable: Vec<&Arc<RegisteredTool>> =
            tools.iter().filter(|t| t.defer != Defer::Never).collect();
        (!deferrable.is_empty()).then(|| Arc::new(Part::build(deferrable)))
    }

    /// The catalog of this view in `format`, for a session that has seen `revealed` (see
    /// [`SessionScope::revealed`]): with nothing deferred, every tool in order. When tools are
    /// deferred: `tool_search` first; the Anthropic shape lists every tool, each deferred one
    /// with `defer_loading: true` (and never `cache_control`); the OpenAI shape lists the tools
    /// not deferred, then the revealed deferred ones in the order they were revealed (appended,
    /// so a prompt cache of the earlier part survives). The MCP shape never defers (MCP clients
    /// defer tools themselves). Records the bytes of definitions the deferral kept out.
    pub fn catalog(&self, scope: &SessionScope, format: CatalogFormat) -> Vec<Value> {
        let deferral = match (&self.deferral, format) {
            (None, _) | (_, CatalogFormat::Mcp) => {
                return self
                    .order
                    .iter()
                    .map(|t| catalog_entry(t, format))
                    .collect();
            }
            (Some(d), _) => d,
        };
        let revealed = scope.revealed();
        let seen: HashSet<&str> = revealed.iter().map(|n| &**n).collect();
        let mut out = Vec::with_capacity(self.order.len() + 1);
        // The built-in search, unless a registered tool took its name.
        if let Some(search) = self.tools.get(TOOL_SEARCH)
            && self.order.iter().all(|t| &*t.name != TOOL_SEARCH)
        {
            out.push(catalog_entry(search, format));
        }
        let mut avoided = 0usize;
        match format {
            CatalogFormat::Anthropic => {
                for t in &self.order {
                    let mut entry = catalog_entry(t, format);
                    if deferral.is_deferred(t) {
                        entry["defer_loading"] = Value::Bool(true);
                        if !seen.contains(&*t.name) {
                            avoided += t.catalog_bytes;
                        }
                    }
                    out.push(entry);
                }
            }
            _ => {
                for t in &self.order {
                    if deferral.is_deferred(t) {
                        if !seen.contains(&*t.name) {
                            avoided += t.catalog_bytes;
                        }
                    } else {
                        out.push(catalog_entry(t, format));
                    }
                }
                for name in &revealed {
                    if let Some(t) = self.tools.get(name)
                        && deferral.is_deferred(t)
                    {
                        out.push(catalog_entry(t, format));
                    }
                }
            }
        }
        self.metrics.catalog_bytes_avoided(avoided);
        out
    }

    /// The tool of exactly this name (no trimming, no case folding).
    pub fn get(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.tools.get(name)
    }
    /// How many tools are registered in the view (the built-in `tool_search` not counted).
    pub fn len(&self) -> usize {
        self.order.len()
    }
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    /// True when no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// The catalog shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatalogFormat {
    /// `{name, description, input_schema}` (Anthropic Messages `tools`).
    #[default]
    Anthropic,
    /// `{type: "function", function: {name, description, parameters}}` (OpenAI Chat Completions).
    OpenAi,
    /// `{name, description, inputSchema}` (MCP `tools/list`).
    Mcp,
}

/// The Registry actor's state.
#[derive(Actor)]
pub struct Registry {
    /// Registration order, which is catalog order.
    order: Vec<Arc<RegisteredTool>>,
    version: Arc<AtomicU64>,
    snapshot: Arc<Snapshot>,
    metrics: Arc<EngineMetrics>,
    config: DeferralConfig,
}

impl Registry {
    /// An empty registry publishing its version through `version` and recording into `metrics`.
    pub fn new(version: Arc<AtomicU64>, metrics: Arc<EngineMetrics>) -> Self {
        metrics.registry_tools(0);
        Registry {
            order: Vec::new(),
            snapshot: Arc::new(Snapshot {
                version: version.load(Ordering::Acquire),
                metrics: Arc::clone(&metrics),
                ..Snapshot::default()
            }),
            version,
            metrics,
            config: DeferralConfig::default(),
        }
    }

    /// The same registry deferring `auto` tools per `config`.
    pub fn with_deferral(mut self, config: DeferralConfig) -> Self {
        self.config = config;
        self.publish();
        self
    }

    /// Registers a tool (also used by the engine builder before the actor starts).
    pub fn register(&mut self, spec: ToolSpec) -> Result<(), RegistryError> {
        self.register_all([spec])
    }

    /// Registers tools in order, publishing once; the first refusal stops (the tools before it
    /// stay registered). The embedder's own tools: each pattern of their schemas is bounded,
    /// their number is not ([`validation::Budget::embedder`]).
    pub fn register_all(
        &mut self,
        specs: impl IntoIterator<Item = ToolSpec>,
    ) -> Result<(), RegistryError> {
        let mut result = Ok(());
        let mut budget = validation::Budget::embedder();
        let before = self.order.len();
        let mut names: HashSet<Arc<str>> = self.order.iter().map(|t| Arc::clone(&t.name)).collect();
        for spec in specs {
            if names.contains(spec.name.as_str()) {
                result = Err(RegistryError::Duplicate(spec.name));
                break;
            }
            match prepare_in(spec, &mut budget) {
                Ok(tool) => {
                    names.insert(Arc::clone(&tool.name));
                    self.order.push(Arc::new(tool));
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if self.order.len() != before {
            self.publish();
        }
        result
    }
}

/// Checks a spec's name and compiles its schema: the registered form of a tool, made outside the
/// registry for a session's own tools (see [`Snapshot::extended`]). A catalog of its own.
pub fn prepare(spec: ToolSpec) -> Result<RegisteredTool, RegistryError> {
    prepare_in(spec, &mut validation::Budget::catalog())
}

/// [`prepare`] for one tool of a catalog, whose schemas' compile cost `budget` bounds.
pub fn prepare_in(
    spec: ToolSpec,
    budget: &mut validation::Budget,
) -> Result<RegisteredTool, RegistryError> {
    if spec.name.is_empty() {
        return Err(RegistryError::EmptyName);
    }
    if !valid_tool_name(&spec.name) {
        return Err(RegistryError::InvalidName(spec.name));
    }
    let validator = validation::compile_in(&spec.input_schema, budget).map_err(|detail| {
        RegistryError::BadSchema {
            name: spec.name.clone(),
            detail,
        }
    })?;
    let metrics = ToolMetrics::new(&spec.name);
    let catalog_bytes = json!({
        "name": spec.name, "description": spec.description, "input_schema": spec.input_schema,
    })
    .to_string()
    .len();
    let limiter = spec
        .policy
        .max_concurrency
        .map(|n| Limiter::new(n, TOOL_QUEUE_LIMIT));
    Ok(RegisteredTool {
        metrics,
        limiter,
        breaker: Breaker::default(),
        name: Arc::from(spec.name),
        description: spec.description,
        input_schema: spec.input_schema,
        handler: spec.handler,
        policy: spec.policy,
        access: spec.access,
        validator,
        subject: spec.subject,
        policy_decisions: Default::default(),
        policy_rules: Default::default(),
        defer: spec.defer,
        effect: spec.effect,
        catalog_bytes,
    })
}

impl Registry {
    /// Removes a tool; false if it was not registered.
    pub fn unregister(&mut self, name: &str) -> bool {
        let before = self.order.len();
        self.order.retain(|t| &*t.name != name);
        let removed = self.order.len() != before;
        if removed {
            self.publish();
        }
        removed
    }

    /// Removes every tool whose name starts with `prefix` and registers `specs` in their place,
    /// publishing once (one version bump), so a turn sees either the old set or the new one. A
    /// spec that is refused (bad name, schema, a duplicate, or a name outside `prefix`) is
    /// skipped; the refusals are returned. The specs are one catalog (one server's listing):
    /// their schemas share one [`validation::Budget`].
    pub fn replace_group(&mut self, prefix: &str, specs: Vec<ToolSpec>) -> Vec<RegistryError> {
        self.order.retain(|t| !t.name.starts_with(prefix));
        let mut budget = validation::Budget::catalog();
        let mut names: std::collections::HashSet<Arc<str>> =
            self.order.iter().map(|t| Arc::clone(&t.name)).collect();
        let mut refused = Vec::new();
        for spec in specs {
            if !spec.name.starts_with(prefix) {
                refused.push(RegistryError::InvalidName(spec.name));
                continue;
            }
            if names.contains(spec.name.as_str()) {
                refused.push(RegistryError::Duplicate(spec.name));
                continue;
            }
            match prepare_in(spec, &mut budget) {
                Ok(tool) => {
                    names.insert(Arc::clone(&tool.name));
                    self.order.push(Arc::new(tool));
                }
                Err(e) => refused.push(e),
            }
        }
        self.publish();
        refused
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshot)
    }

    /// The catalog in the given shape, every tool in order: fresh copies, detached from the
    /// registry.
    #[cfg(test)]
    pub fn catalog(&self, format: CatalogFormat) -> Vec<Value> {
        self.order
            .iter()
            .map(|t| catalog_entry(t, format))
            .collect()
    }

    fn publish(&mut self) {
        let version = self.version.fetch_add(1, Ordering::AcqRel) + 1;
        self.metrics.registry_tools(self.order.len());
        let part = Snapshot::index(&self.order);
        self.snapshot = Arc::new(Snapshot::assemble(
            version,
            self.order.clone(),
            Arc::clone(&self.metrics),
            self.config,
            part.clone(),
            part.into_iter().collect(),
            HashSet::new(),
        ));
    }
}

/// One tool's catalog entry in `format`: a fresh copy.
pub fn catalog_entry(t: &RegisteredTool, format: CatalogFormat) -> Value {
    match format {
        CatalogFormat::Anthropic => json!({
            "name": &*t.name, "description": t.description, "input_schema": t.input_schema,
        }),
        CatalogFormat::OpenAi => json!({
            "type": "function",
            "function": {"name": &*t.name, "description": t.description, "parameters": t.input_schema},
        }),
        CatalogFormat::Mcp => json!({
            "name": &*t.name, "description": t.description, "inputSchema": t.input_schema,
        }),
    }
}

/// Register a tool.
pub struct Register(pub ToolSpec);
/// Unregister a tool by name.
pub struct Unregister(pub String);
/// Replace every tool whose name starts with the prefix by a new set, in one version bump.
pub struct ReplaceGroup {
    /// The prefix (an MCP server's `mcp__<server>__`).
    pub prefix: String,
    /// The new set (may be empty: the group is removed).
    pub specs: Vec<ToolSpec>,
}
/// Ask for the current snapshot.
pub struct GetSnapshot;

impl Message<Register> for Registry {
    type Reply = Result<(), RegistryError>;
    async fn handle(&mut self, msg: Register, _: &mut Context<Self, Self::Reply>) -> Self::Reply {
        self.register(msg.0)
    }
}

impl Message<Unregister> for Registry {
    type Reply = bool;
    async fn handle(&mut self, msg: Unregister, _: &mut Context<Self, Self::Reply>) -> bool {
        self.unregister(&msg.0)
    }
}

impl Message<ReplaceGroup> for Registry {
    type Reply = Vec<RegistryError>;
    async fn handle(
        &mut self,
        msg: ReplaceGroup,
        _: &mut Context<Self, Self::Reply>,
    ) -> Self::Reply {
        self.replace_group(&msg.prefix, msg.specs)
    }
}

impl Message<GetSnapshot> for Registry {
    type Reply = Arc<Snapshot>;
    async fn handle(
        &mut self,
        _: GetSnapshot,
        _: &mut Context<Self, Self::Reply>,
    ) -> Arc<Snapshot> {
        self.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::Handler;

    fn spec(name: &str, schema: Value) -> ToolSpec {
        ToolSpec::new(name, "d", schema, Handler::inline(|_, _| Ok(String::new())))
    }

    fn object() -> Value {
        json!({"type":"object","properties":{"x":{"type":"integer"}}})
    }

    #[test]
    fn registration_refuses_bad_names_duplicates_and_schemas() {
        let mut r = Registry::new(Arc::default(), Arc::default());
        assert_eq!(
            r.register(spec("", object())),
            Err(RegistryError::EmptyName)
        );
        assert!(matches!(
            r.register(spec("has space", object())),
            Err(RegistryError::InvalidName(_))
        ));
        assert!(matches!(
            r.register(spec(&"a".repeat(65), object())),
            Err(RegistryError::InvalidName(_))
        ));
        assert!(r.register(spec("mcp__server__tool", object())).is_ok());
        assert_eq!(
            r.register(spec("mcp__server__tool", object()))
                .unwrap_err()
                .to_string(),
            "duplicate tool name: mcp__server__tool"
        );
        assert!(matches!(
            r.register(spec("s", json!({"type":"string"}))),
            Err(RegistryError::BadSchema { .. })
        ));
    }

    #[test]
    fn the_embedders_tools_have_no_pattern_count_but_each_pattern_is_bounded() {
        let with =
            |p: &str| json!({"type":"object","properties":{"x":{"type":"string","pattern":p}}});
        let many = (0..=crate::validation::MAX_CATALOG_PATTERNS * 2)
            .map(|i| spec(&format!("t{i}"), with("^[a-z]+$")));
        let mut r = Registry::new(Arc::default(), Arc::default());
        r.register_all(many).unwrap();
        assert_eq!(
            r.snapshot().len(),
            crate::validation::MAX_CATALOG_PATTERNS * 2 + 1
        );
        let err = r
            .register_all([spec("greedy", with("[^x]{3000}y"))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("compiles to more than"), "{err}");
    }

    #[test]
    fn every_change_bumps_the_shared_version() {
        let version = Arc::new(AtomicU64::new(0));
        let mut r = Registry::new(Arc::clone(&version), Arc::default());
        r.register(spec("a", object())).unwrap();
        assert_eq!(version.load(Ordering::Acquire), 1);
        assert!(r.unregister("a"));
        assert!(!r.unregister("a"));
        assert_eq!(version.load(Ordering::Acquire), 2);
        assert_eq!(r.snapshot().version, 2);
        assert!(r.snapshot().is_empty());
    }

    #[test]
    fn a_group_is_replaced_in_one_version_bump() {
        let version = Arc::new(AtomicU64::new(0));
        let mut r = Registry::new(Arc::clone(&version), Arc::default());
        r.register(spec("keep", object())).unwrap();
        r.register(spec("mcp__s__old", object())).unwrap();
        r.register(spec("mcp__s__gone", object())).unwrap();
        let before = version.load(Ordering::Acquire);
        let refused = r.replace_group(
            "mcp__s__",
            vec![
                spec("mcp__s__old", object()),
                spec("mcp__s__new", object()),
                spec("mcp__s__bad", json!({"type": "string"})),
                spec("keep", object()),
            ],
        );
        assert_eq!(version.load(Ordering::Acquire), before + 1);
        assert_eq!(refused.len(), 2, "{refused:?}");
        let snap = r.snapshot();
        let mut names: Vec<_> = ["keep", "mcp__s__old", "mcp__s__new", "mcp__s__gone"]
            .into_iter()
            .filter(|n| snap.get(n).is_some())
            .collect();
        names.sort();
        assert_eq!(names, ["keep", "mcp__s__new", "mcp__s__old"]);
        r.replace_group("mcp__s__", Vec::new());
        assert_eq!(r.snapshot().len(), 1);
    }

    #[test]
    fn catalogs_are_detached_copies_in_three_shapes() {
        let mut r = Registry::new(Arc::default(), Arc::default());
        r.register(spec("a", object())).unwrap();
        let mut cat = r.catalog(CatalogFormat::Anthropic);
        cat[0]["input_schema"]["properties"]["x"]["type"] = json!("string");
        assert_eq!(
            r.catalog(CatalogFormat::Anthropic)[0]["input_schema"],
            object()
        );
        assert_eq!(
            r.catalog(CatalogFormat::OpenAi)[0]["function"]["parameters"],
            object()
        );
        assert_eq!(r.catalog(CatalogFormat::Mcp)[0]["inputSchema"], object());
    }
}
