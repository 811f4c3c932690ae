//! What a command rule sees of one `bash` command: the command read with a bash grammar
//! (`brush-parser`), every simple command it holds, and what no rule can read before it runs.
//!
//! [`read`] walks the whole syntax tree — lists, pipelines, `!` and `time`, `{ …; }`, subshells,
//! `if`/`while`/`until`/`for`/`case` (conditions included), function bodies, `coproc`, `[[ … ]]`,
//! command and process substitutions, here-documents, the embedded words of `${…}` — and keeps:
//!
//! * **the simple commands as written** ([`View::written`]), each as its words after quote
//!   removal (`'rm'`, `\rm`, `r""m` are all `rm`); a word whose text the shell decides only when
//!   it runs (an expansion, a substitution, a glob, a brace expansion, a tilde) is
//!   [`Word::Dynamic`]. An allow rule must match every one of them.
//! * **what the shell may run beyond them** (deny and ask rules look at these too): the command
//!   after a wrapper that runs its arguments (`env`, `timeout`, `nice`, `command`, `exec`, `find
//!   -exec`, …: every tail of its arguments), and the code given to `eval`, `bash -c`/`sh -c` and
//!   `trap` when it is plain text (read again, recursively).
//! * **what stays hidden** ([`View::hidden`]): a command name known only when it runs (`$cmd`,
//!   `rm${IFS}v`), `eval` or `sh -c` of text known only when it runs, `source`, a shell reading
//!   its input, `xargs` and others that build a command from their input, `alias` and `hash`
//!   (they rename commands), arithmetic on variables and array subscripts (bash evaluates a
//!   variable's value there, substitutions included), `${!name}`, `${x@P}`, and anything this
//!   grammar cannot parse or that nests too deeply to read.
//! * **why an allow rule cannot take the command at all** ([`View::unallowable`]): it defines a
//!   function, sets variables, or redirects output to a file.
//!
//! It reads the shell's words, never what a program does with them (`python -c`, `git -c
//! alias…`, a copy of `rm` under another name): a command rule is no sandbox.

use std::io::Cursor;
use std::sync::Arc;

use brush_parser::ast;
use brush_parser::word::{self, Parameter, ParameterExpr, ParameterTransformOp, WordPiece};

/// One word of a simple command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Word {
    /// Its text, after quote removal: the shell expands nothing in it.
    Literal(String),
    /// Text the shell decides only when it runs (any number of words, even none).
    Dynamic,
}

/// What a command rule can see of one command ([`read`]).
#[derive(Debug, Default)]
pub(crate) struct View {
    /// Every simple command of the text as written (substitutions and bodies included), in order.
    pub(crate) written: Vec<Arc<[Word]>>,
    /// Every command the shell may run, as (words, first word): the written ones, every tail of
    /// a wrapper's arguments, and commands of code read again (`eval`, `sh -c`, `trap`).
    pub(crate) seen: Vec<(Arc<[Word]>, usize)>,
    /// The first part of the command no rule can read, said for the model.
    pub(crate) hidden: Option<String>,
    /// Why no allow rule can take the command as a whole.
    pub(crate) unallowable: Option<String>,
}

/// How a pattern relates to a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fit {
    /// It matches.
    Yes,
    /// It may match once the shell expands what it expands: the reason.
    Maybe(String),
    /// It does not.
    No,
}

/// Code read again (`eval`, `sh -c`, substitutions) at most this deep.
const MAX_NESTING: u32 = 8;
/// Nesting of brackets and compound commands read within one text (the parser recurses on it).
const MAX_DEPTH: usize = 100;
/// Backquotes in one text (their nesting cannot be told without parsing).
const MAX_BACKQUOTES: usize = 64;
/// Words looked at in one command, wrappers' tails included; past it the rest stays hidden.
const BUDGET: usize = 200_000;
/// Stack the parser and the walk get: a new one when less than the red zone is left.
const RED_ZONE: usize = 4 << 20;
const STACK: usize = 16 << 20;

/// Programs that run their arguments as a command: every tail of their arguments is a command
/// the shell may run.
const WRAPPERS: &[&str] = &[
    "builtin",
    "busybox",
    "caffeinate",
    "cgexec",
    "chroot",
    "chrt",
    "command",
    "doas",
    "env",
    "exec",
    "fakeroot",
    "find",
    "firejail",
    "flock",
    "ionice",
    "ltrace",
    "nice",
    "nohup",
    "nsenter",
    "numactl",
    "prlimit",
    "proot",
    "setpriv",
    "setsid",
    "stdbuf",
    "strace",
    "sudo",
    "systemd-run",
    "taskset",
    "time",
    "timeout",
    "toybox",
    "unbuffer",
    "unshare",
    "valgrind",
    "xvfb-run",
];

/// Shells whose `-c` code is bash (or POSIX sh) text.
const SHELLS: &[&str] = &[
    "ash", "bash", "dash", "ksh", "ksh93", "mksh", "posh", "rbash", "sh", "yash", "zsh",
];

/// Programs that run commands a rule cannot read: from a file, from their input, under new
/// names, or in another shell's language.
const OPAQUE: &[&str] = &[
    ".", "alias", "csh", "enable", "fc", "fish", "hash", "parallel", "pwsh", "runuser", "script",
    "source", "su", "tcsh", "watch", "xargs",
];

/// Builtins that take variable names, where `name[subscript]` is evaluated as arithmetic.
const NAME_TAKERS: &[&str] = &[
    "[",
    "compgen",
    "declare",
    "export",
    "getopts",
    "local",
    "mapfile",
    "printf",
    "read",
    "readarray",
    "readonly",
    "test",
    "typeset",
    "unset",
    "wait",
];

/// Reads `command` as bash would parse it.
pub(crate) fn read(command: &str) -> View {
    stacker::maybe_grow(RED_ZONE, STACK, || {
        let mut reader = Reader {
            view: View::default(),
            budget: BUDGET,
            nesting: 0,
            written: true,
        };
        reader.program(command);
        reader.view
    })
}

impl View {
    /// Whether `pattern` (words; `prefix`: followed by anything) matches a command the shell may
    /// run. A command name with a `/` is also matched by its last part (`/bin/rm` is `rm`).
    pub(crate) fn may_run(&self, pattern: &[String], prefix: bool) -> Fit {
        let mut maybe = None;
        for (words, from) in &self.seen {
            let words = &words[*from..];
            match fit(pattern, words, prefix, false) {
                Fit::Yes => return Fit::Yes,
                Fit::Maybe(why) => maybe = maybe.or(Some(why)),
                Fit::No => {}
            }
            if matches!(words.first(), Some(Word::Literal(w)) if w.contains('/')) {
                match fit(pattern, words, prefix, true) {
                    Fit::Yes => return Fit::Yes,
                    Fit::Maybe(why) => maybe = maybe.or(Some(why)),
                    Fit::No => {}
                }
            }
        }
        match maybe.or_else(|| self.hidden.clone()) {
            Some(why) => Fit::Maybe(why),
            None => Fit::No,
        }
    }

    /// Why no allow rule can take this command, if one cannot: something hidden, a function, a
    /// variable set, output redirected to a file, or no command at all.
    pub(crate) fn not_allowable(&self) -> Option<&str> {
        self.hidden
            .as_deref()
            .or(self.unallowable.as_deref())
            .or_else(|| self.written.is_empty().then_some("no command"))
    }
}

/// Whether `pattern` matches `words` as written (`basename`: the first word by its last `/`
/// part). An allow rule takes only [`Fit::Yes`].
pub(crate) fn fit(pattern: &[String], words: &[Word], prefix: bool, basename: bool) -> Fit {
    for (i, want) in pattern.iter().enumerate() {
        match words.get(i) {
            None => return Fit::No,
            Some(Word::Dynamic) => return Fit::Maybe(dynamic_word(i)),
            Some(Word::Literal(have)) => {
                let have = if i == 0 && basename {
                    have.rsplit('/').next().unwrap_or(have)
                } else {
                    have
                };
                if have != want {
                    return Fit::No;
                }
            }
        }
    }
    let rest = &words[pattern.len()..];
    if prefix || rest.is_empty() {
        Fit::Yes
    } else if rest.iter().all(|w| *w == Word::Dynamic) {
        // An expansion may come to nothing.
        Fit::Maybe(dynamic_word(pattern.len()))
    } else {
        Fit::No
    }
}

fn dynamic_word(i: usize) -> String {
    if i == 0 {
        "a command whose name is known only when it runs".into()
    } else {
        format!("word {} of a command is known only when it runs", i + 1)
    }
}

/// The walk over one command's syntax.
struct Reader {
    view: View,
    /// Words left to look at.
    budget: usize,
    /// How deep in code read again.
    nesting: u32,
    /// Whether commands found now are written in the command (else: in code read again).
    written: bool,
}

impl Reader {
    fn hide(&mut self, why: impl Into<String>) {
        if self.view.hidden.is_none() {
            self.view.hidden = Some(why.into());
        }
    }

    fn not_allowable(&mut self, why: &str) {
        if self.view.unallowable.is_none() {
            self.view.unallowable = Some(why.to_string());
        }
    }

    /// Takes `n` from the budget; false (and hidden) once it is spent.
    fn spend(&mut self, n: usize) -> bool {
        if self.budget < n {
            self.budget = 0;
            self.hide("the command is too long to read");
            return false;
        }
        self.budget -= n;
        true
    }

    /// Parses `text` and walks it.
    fn program(&mut self, text: &str) {
        if self.nesting > MAX_NESTING {
            self.hide("code nested too deeply to read");
            return;
        }
        if too_deep(text) {
            self.hide("the command nests too deeply to read");
            return;
        }
        let options = brush_parser::ParserOptions::default();
        let parsed = stacker::maybe_grow(RED_ZONE, STACK, || {
            brush_parser::Parser::new(Cursor::new(text.as_bytes()), &options).parse_program()
        });
        let Ok(program) = parsed else {
            self.hide("text that does not parse as bash here");
            return;
        };
        self.nesting += 1;
        for list in &program.complete_commands {
            self.list(list);
        }
        self.nesting -= 1;
    }

    /// `text` read again as code (`eval`, `sh -c`, `trap`): what it runs is seen, not written.
    fn code(&mut self, text: &str) {
        let written = std::mem::replace(&mut self.written, false);
        self.program(text);
        self.written = written;
    }

    fn list(&mut self, list: &ast::CompoundList) {
        for item in &list.0 {
            self.pipeline(&item.0.first);
            for next in &item.0.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline) {
        for command in &pipeline.seq {
            self.command(command);
        }
    }

    fn command(&mut self, command: &ast::Command) {
        match command {
            ast::Command::Simple(simple) => self.simple(simple),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound);
                self.redirects(redirects.as_ref());
            }
            ast::Command::Function(function) => {
                self.not_allowable("it defines a function");
                self.compound(&function.body.0);
                self.redirects(function.body.1.as_ref());
            }
            ast::Command::ExtendedTest(test, redirects) => {
                self.test(&test.expr);
                self.redirects(redirects.as_ref());
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand) {
        use ast::CompoundCommand as C;
        match compound {
            C::Arithmetic(a) => self.arithmetic(&a.expr.value),
            C::ArithmeticForClause(f) => {
                for e in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&e.value);
                }
                self.list(&f.body.list);
            }
            C::BraceGroup(b) => self.list(&b.list),
            C::Subshell(s) => self.list(&s.list),
            C::ForClause(f) => {
                for w in f.values.iter().flatten() {
                    self.word(&w.value);
                }
                self.list(&f.body.list);
            }
            C::CaseClause(c) => {
                self.word(&c.value.value);
                for item in &c.cases {
                    for p in &item.patterns {
                        self.word(&p.value);
                    }
                    if let Some(cmd) = &item.cmd {
                        self.list(cmd);
                    }
                }
            }
            C::IfClause(i) => {
                self.list(&i.condition);
                self.list(&i.then);
                for e in i.elses.iter().flatten() {
                    if let Some(c) = &e.condition {
                        self.list(c);
                    }
                    self.list(&e.body);
                }
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0);
                self.list(&w.1.list);
            }
            C::Coprocess(c) => {
                if let Some(name) = &c.name {
                    self.word(&name.value);
                }
                self.command(&c.body);
            }
        }
    }

    fn test(&mut self, expr: &ast::ExtendedTestExpr) {
        use ast::ExtendedTestExpr as E;
        match expr {
            E::And(a, b) | E::Or(a, b) => {
                self.test(a);
                self.test(b);
            }
            E::Not(a) | E::Parenthesized(a) => self.test(a),
            E::UnaryTest(predicate, w) => {
                if matches!(
                    predicate,
                    ast::UnaryPredicate::ShellVariableIsSetAndAssigned
                ) && w.value.contains('[')
                {
                    self.hide(SUBSCRIPT);
                }
                self.word(&w.value);
            }
            E::BinaryTest(predicate, l, r) => {
                use ast::BinaryPredicate as B;
                if matches!(
                    predicate,
                    B::ArithmeticEqualTo
                        | B::ArithmeticNotEqualTo
                        | B::ArithmeticLessThan
                        | B::ArithmeticLessThanOrEqualTo
                        | B::ArithmeticGreaterThan
                        | B::ArithmeticGreaterThanOrEqualTo
                ) {
                    self.arithmetic(&l.value);
                    self.arithmetic(&r.value);
                }
                self.word(&l.value);
                self.word(&r.value);
            }
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand) {
        use ast::CommandPrefixOrSuffixItem as Item;
        let mut words = Vec::new();
        let mut assigns = false;
        let prefix = simple.prefix.iter().flat_map(|p| p.0.iter());
        let suffix = simple.suffix.iter().flat_map(|s| s.0.iter());
        let mut item =
            |reader: &mut Reader, words: &mut Vec<Word>, item: &Item, in_prefix| match item {
                Item::IoRedirect(r) => reader.redirect(r),
                Item::Word(w) => words.push(reader.word(&w.value)),
                Item::AssignmentWord(a, w) => {
                    reader.assignment(a);
                    if in_prefix {
                        assigns = true;
                    } else {
                        words.push(reader.word(&w.value));
                    }
                }
                Item::ProcessSubstitution(_, sub) => {
                    reader.list(&sub.list);
                    words.push(Word::Dynamic);
                }
            };
        for i in prefix {
            item(self, &mut words, i, true);
        }
        if let Some(name) = &simple.word_or_name {
            let w = self.word(&name.value);
            words.push(w);
        }
        for i in suffix {
            item(self, &mut words, i, false);
        }
        if assigns {
            self.not_allowable("it sets variables");
        }
        if !words.is_empty() {
            self.run(words.into());
        }
    }

    fn assignment(&mut self, a: &ast::Assignment) {
        if let ast::AssignmentName::ArrayElementName(_, index) = &a.name {
            self.arithmetic(index);
        }
        match &a.value {
            ast::AssignmentValue::Scalar(w) => {
                self.word(&w.value);
            }
            ast::AssignmentValue::Array(items) => {
                for (key, value) in items {
                    if let Some(key) = key {
                        self.word(&key.value);
                    }
                    self.word(&value.value);
                }
            }
        }
    }

    fn redirects(&mut self, list: Option<&ast::RedirectList>) {
        for r in list.iter().flat_map(|l| l.0.iter()) {
            self.redirect(r);
        }
    }

    fn redirect(&mut self, redirect: &ast::IoRedirect) {
        use ast::IoFileRedirectKind as K;
        use ast::IoFileRedirectTarget as T;
        match redirect {
            ast::IoRedirect::File(_, kind, target) => {
                let writes = matches!(kind, K::Write | K::Append | K::Clobber | K::ReadAndWrite);
                match target {
                    T::Filename(w) => {
                        let to = self.word(&w.value);
                        if writes && !harmless(&to) {
                            self.not_allowable("it redirects output to a file");
                        }
                    }
                    T::Duplicate(w) => {
                        let to = self.word(&w.value);
                        let fd = matches!(&to, Word::Literal(t)
                            if t.bytes().all(|b| b.is_ascii_digit() || b == b'-'));
                        if !fd {
                            self.not_allowable("it redirects output to a file");
                        }
                    }
                    T::Fd(_) => {}
                    T::ProcessSubstitution(_, sub) => self.list(&sub.list),
                }
            }
            ast::IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    let options = brush_parser::ParserOptions::default();
                    match word::parse_heredoc(&doc.doc.value, &options) {
                        Ok(pieces) => {
                            self.pieces(&pieces, true);
                        }
                        Err(_) => self.hide("a here-document this parser cannot read"),
                    }
                }
            }
            ast::IoRedirect::HereString(_, w) => {
                self.word(&w.value);
            }
            ast::IoRedirect::OutputAndError(w, _) => {
                let to = self.word(&w.value);
                if !harmless(&to) {
                    self.not_allowable("it redirects output to a file");
                }
            }
        }
    }

    /// One simple command the shell runs: recorded as written (or seen), then looked into.
    fn run(&mut self, words: Arc<[Word]>) {
        if !self.spend(words.len()) {
            return;
        }
        if self.written {
            self.view.written.push(Arc::clone(&words));
        }
        self.view.seen.push((Arc::clone(&words), 0));
        self.inspect(&words, 0, true);
    }

    /// What the command `words[from..]` runs besides itself.
    fn inspect(&mut self, words: &Arc<[Word]>, from: usize, wrappers: bool) {
        let args = &words[from..];
        let Some(Word::Literal(program)) = args.first() else {
            if wrappers {
                self.hide(dynamic_word(0));
            }
            // The tail of a wrapper starting with a dynamic word matches rules as "maybe".
            return;
        };
        let name = program.rsplit('/').next().unwrap_or(program).to_string();
        let name = name.as_str();
        if name == "eval" {
            match literal_text(&args[1..]) {
                Some(text) => {
                    if self.spend(text.len() / 8 + 1) {
                        self.code(&text);
                    }
                }
                None => self.hide("eval of text known only when it runs"),
            }
        } else if SHELLS.contains(&name) {
            self.shell(&args[1..]);
        } else if name == "trap" {
            self.trap(&args[1..]);
        } else if OPAQUE.contains(&name) {
            self.hide(format!(
                "{name}, which runs commands no rule can read before they run"
            ));
        } else if name == "env"
            && args
                .iter()
                .any(|w| matches!(w, Word::Literal(a) if a.starts_with("-S") || a.starts_with("--split-string")))
        {
            self.hide("env -S, which splits a string into a command");
        } else if NAME_TAKERS.contains(&name)
            && args[1..]
                .iter()
                .any(|w| matches!(w, Word::Literal(a) if a.contains('[')))
        {
            self.hide(SUBSCRIPT);
        } else if name == "let" {
            for w in &args[1..] {
                match w {
                    Word::Literal(a) => self.arithmetic(a),
                    Word::Dynamic => self.hide(ARITHMETIC),
                }
            }
        } else if matches!(name, "declare" | "typeset" | "local")
            && args[1..].iter().any(
                |w| matches!(w, Word::Literal(a) if a.starts_with('-') && a.contains('i')),
            )
        {
            self.hide(ARITHMETIC);
        }
        if wrappers && WRAPPERS.contains(&name) {
            // Every tail of the arguments may be the command it runs (its options differ per
            // program, so none is skipped by name); each tail is looked into, but not as a
            // wrapper again — every tail is already here.
            for start in from + 1..words.len() {
                if !self.spend(1) {
                    return;
                }
                self.view.seen.push((Arc::clone(words), start));
                self.inspect(words, start, false);
            }
        }
    }

    /// `sh [options] -c CODE …`: the code is read again; a shell without `-c` reads a file or its
    /// input, which no rule can see.
    fn shell(&mut self, args: &[Word]) {
        let mut c = false;
        let mut i = 0;
        while let Some(Word::Literal(a)) = args.get(i) {
            if a == "--" || a == "-" {
                i += 1;
                break;
            }
            if let Some(long) = a.strip_prefix("--") {
                i += if matches!(long, "rcfile" | "init-file") {
                    2
                } else {
                    1
                };
            } else if a.len() > 1 && (a.starts_with('-') || a.starts_with('+')) {
                c |= a[1..].contains('c');
                i += if a[1..].contains(['o', 'O']) { 2 } else { 1 };
            } else {
                break;
            }
        }
        if !c {
            self.hide("a shell reading its commands from a file or its input");
            return;
        }
        match args.get(i) {
            Some(Word::Literal(code)) => {
                let code = code.clone();
                self.code(&code);
            }
            Some(Word::Dynamic) => self.hide("sh -c of text known only when it runs"),
            None => {}
        }
    }

    /// `trap CODE SIGNAL…`: the code runs later, in this shell.
    fn trap(&mut self, args: &[Word]) {
        let args = match args.first() {
            Some(Word::Literal(a)) if a == "--" => &args[1..],
            _ => args,
        };
        match args.first() {
            Some(Word::Literal(a)) if a.starts_with('-') || args.len() < 2 => {}
            Some(Word::Literal(code)) => {
                let code = code.clone();
                self.code(&code);
            }
            Some(Word::Dynamic) => self.hide("trap of text known only when it runs"),
            None => {}
        }
    }

    /// Arithmetic text: bash evaluates the value of every variable it names as arithmetic
    /// again, and a value may hold `a[$(cmd)]`, so only plain numbers and operators are read.
    fn arithmetic(&mut self, text: &str) {
        if text
            .chars()
            .any(|c| c.is_alphabetic() || matches!(c, '$' | '`' | '[' | '\'' | '"' | '\\'))
        {
            self.hide(ARITHMETIC);
        }
    }

    /// One word: its text if the shell expands nothing in it, else [`Word::Dynamic`]; the
    /// commands of its substitutions are walked.
    fn word(&mut self, text: &str) -> Word {
        if !self.spend(1) {
            return Word::Dynamic;
        }
        let options = brush_parser::ParserOptions::default();
        match word::parse(text, &options) {
            Ok(pieces) => match self.pieces(&pieces, false) {
                Some(text) => Word::Literal(text),
                None => Word::Dynamic,
            },
            Err(_) => {
                self.hide("a word this parser cannot read");
                Word::Dynamic
            }
        }
    }

    /// The text of word pieces (`None`: the shell decides it when it runs).
    fn pieces(&mut self, pieces: &[word::WordPieceWithSource], quoted: bool) -> Option<String> {
        let mut text = Some(String::new());
        let push = |text: &mut Option<String>, s: &str| {
            if let Some(t) = text {
                t.push_str(s);
            }
        };
        for piece in pieces {
            match &piece.piece {
                WordPiece::Text(s) => {
                    if !quoted && s.contains(['*', '?', '[', '{', '(', '~']) {
                        // A glob, a brace expansion or an extended glob.
                        text = None;
                    }
                    push(&mut text, s);
                }
                WordPiece::SingleQuotedText(s) => push(&mut text, s),
                WordPiece::AnsiCQuotedText(s) => {
                    if s.contains('\\') {
                        text = None;
                    }
                    push(&mut text, s);
                }
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => match self.pieces(inner, true) {
                    Some(s) => push(&mut text, &s),
                    None => text = None,
                },
                WordPiece::EscapeSequence(s) => {
                    let c = s.strip_prefix('\\').unwrap_or(s);
                    if c != "\n" {
                        push(&mut text, c);
                    }
                }
                WordPiece::TildeExpansion(_) => text = None,
                WordPiece::ParameterExpansion(p) => {
                    self.parameter(p);
                    text = None;
                }
                WordPiece::CommandSubstitution(code)
                | WordPiece::BackquotedCommandSubstitution(code) => {
                    self.program(code);
                    text = None;
                }
                WordPiece::ArithmeticExpression(e) => {
                    self.arithmetic(&e.value);
                    text = None;
                }
            }
        }
        text
    }

    fn parameter(&mut self, expr: &ParameterExpr) {
        use ParameterExpr as P;
        let (parameter, indirect, words): (Option<&Parameter>, bool, Vec<&String>) = match expr {
            P::Parameter {
                parameter,
                indirect,
            }
            | P::ParameterLength {
                parameter,
                indirect,
            } => (Some(parameter), *indirect, vec![]),
            P::UseDefaultValues {
                parameter,
                indirect,
                default_value: text,
                ..
            }
            | P::AssignDefaultValues {
                parameter,
                indirect,
                default_value: text,
                ..
            }
            | P::IndicateErrorIfNullOrUnset {
                parameter,
                indirect,
                error_message: text,
                ..
            }
            | P::UseAlternativeValue {
                parameter,
                indirect,
                alternative_value: text,
                ..
            }
            | P::RemoveSmallestSuffixPattern {
                parameter,
                indirect,
                pattern: text,
            }
            | P::RemoveLargestSuffixPattern {
                parameter,
                indirect,
                pattern: text,
            }
            | P::RemoveSmallestPrefixPattern {
                parameter,
                indirect,
                pattern: text,
            }
            | P::RemoveLargestPrefixPattern {
                parameter,
                indirect,
                pattern: text,
            }
            | P::UppercaseFirstChar {
                parameter,
                indirect,
                pattern: text,
            }
            | P::UppercasePattern {
                parameter,
                indirect,
                pattern: text,
            }
            | P::LowercaseFirstChar {
                parameter,
                indirect,
                pattern: text,
            }
            | P::LowercasePattern {
                parameter,
                indirect,
                pattern: text,
            } => (Some(parameter), *indirect, text.iter().collect()),
            P::Substring {
                parameter,
                indirect,
                offset,
                length,
            } => {
                self.arithmetic(&offset.value);
                if let Some(length) = length {
                    self.arithmetic(&length.value);
                }
                (Some(parameter), *indirect, vec![])
            }
            P::Transform {
                parameter,
                indirect,
                op,
            } => {
                if matches!(op, ParameterTransformOp::PromptExpand) {
                    self.hide(
                        "${name@P}, which expands a value as a prompt (substitutions included)",
                    );
                }
                (Some(parameter), *indirect, vec![])
            }
            P::ReplaceSubstring {
                parameter,
                indirect,
                pattern,
                replacement,
                ..
            } => (
                Some(parameter),
                *indirect,
                std::iter::once(pattern).chain(replacement).collect(),
            ),
            P::VariableNames { .. } | P::MemberKeys { .. } => (None, false, vec![]),
        };
        if indirect {
            self.hide("an indirect expansion (${!name}), whose variable is chosen when it runs");
        }
        if let Some(Parameter::NamedWithIndex { index, .. }) = parameter {
            self.arithmetic(index);
        }
        for text in words {
            self.word(text);
        }
    }
}

const SUBSCRIPT: &str =
    "an array subscript, which bash evaluates as arithmetic (substitutions included)";
const ARITHMETIC: &str = "arithmetic on variables, where bash evaluates a variable's value as code (substitutions included)";

/// `/dev/null`, `/dev/stdout`, `/dev/stderr`: a redirection there writes no file.
fn harmless(to: &Word) -> bool {
    matches!(to, Word::Literal(t) if matches!(t.as_str(), "/dev/null" | "/dev/stdout" | "/dev/stderr"))
}

/// The words joined by spaces, as `eval` joins them, if all are literal.
fn literal_text(words: &[Word]) -> Option<String> {
    let mut parts = Vec::with_capacity(words.len());
    for w in words {
        match w {
            Word::Literal(t) => parts.push(t.as_str()),
            Word::Dynamic => return None,
        }
    }
    Some(parts.join(" "))
}

/// True when `text` nests brackets or compound commands deeper than the parser is given room
/// for (counted without regard to quoting, so never less than the real nesting).
fn too_deep(text: &str) -> bool {
    if text.bytes().filter(|&b| b == b'`').count() > MAX_BACKQUOTES {
        return true;
    }
    let mut depth = 0usize;
    for token in text.split(|c: char| !(c.is_alphanumeric() || "(){}[]".contains(c))) {
        let keyword = match token {
            "if" | "while" | "until" | "for" | "case" | "select" => Some(true),
            "fi" | "done" | "esac" => Some(false),
            _ => None,
        };
        match keyword {
            Some(true) => depth += 1,
            Some(false) => depth = depth.saturating_sub(1),
            None => {
                for c in token.chars() {
                    match c {
                        '(' | '{' | '[' => depth += 1,
                        ')' | '}' | ']' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    if depth > MAX_DEPTH {
                        return true;
                    }
                }
            }
        }
        if depth > MAX_DEPTH {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(words: &[&str]) -> Vec<Word> {
        words.iter().map(|w| Word::Literal(w.to_string())).collect()
    }

    fn written(command: &str) -> Vec<Vec<Word>> {
        read(command).written.iter().map(|w| w.to_vec()).collect()
    }

    fn pattern(p: &str) -> Vec<String> {
        p.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn quotes_and_escapes_are_removed_and_expansions_are_dynamic() {
        assert_eq!(written("'rm' v"), [lit(&["rm", "v"])]);
        assert_eq!(written("\\rm v"), [lit(&["rm", "v"])]);
        assert_eq!(written("r\"\"m \"a b\""), [lit(&["rm", "a b"])]);
        assert_eq!(
            written("rm${IFS}v"),
            [vec![Word::Dynamic]],
            "an expansion in a word makes the whole word dynamic"
        );
        assert_eq!(written("ls *.rs")[0][1], Word::Dynamic);
        assert_eq!(written("ls {a,b}")[0][1], Word::Dynamic);
        assert_eq!(written("ls ~")[0][1], Word::Dynamic);
        assert_eq!(written("ls '*'")[0][1], Word::Literal("*".into()));
    }

    #[test]
    fn every_simple_command_of_compound_syntax_is_found() {
        for (command, want) in [
            ("{ rm v; }", "rm"),
            ("if true; then rm v; fi", "rm"),
            ("if rm v; then :; fi", "rm"),
            ("for i in 1; do rm v; done", "rm"),
            ("while rm v; do break; done", "rm"),
            ("until rm v; do :; done", "rm"),
            ("! rm v", "rm"),
            ("time rm v", "rm"),
            ("<<<x rm v", "rm"),
            ("f() { rm v; }; f", "rm"),
            ("function f { rm v; }", "rm"),
            ("case x in x) rm v;; esac", "rm"),
            ("(rm v)", "rm"),
            ("echo $(rm v)", "rm"),
            ("echo `rm v`", "rm"),
            ("echo \"$(rm v)\"", "rm"),
            ("cat <(rm v)", "rm"),
            ("echo ${x:-$(rm v)}", "rm"),
            ("cat <<EOF\n$(rm v)\nEOF", "rm"),
            ("coproc rm v", "rm"),
            ("[[ -n $(rm v) ]]", "rm"),
            ("x=$(rm v)", "rm"),
            ("true && rm v || false", "rm"),
            ("ls | rm v &", "rm"),
        ] {
            let view = read(command);
            assert_eq!(
                view.may_run(&pattern(want), true),
                Fit::Yes,
                "{command:?}: {view:?}"
            );
        }
    }

    #[test]
    fn wrapped_and_evaluated_commands_are_seen() {
        for command in [
            "env rm v",
            "env -i FOO=1 rm v",
            "timeout 5 rm v",
            "nice -n 5 nohup rm v",
            "command rm v",
            "builtin command rm v",
            "exec rm v",
            "find . -exec rm {} ;",
            "/bin/rm v",
            "eval rm v",
            "eval 'rm v'",
            "bash -c 'rm v'",
            "sh -ec 'echo; rm v'",
            "env sh -c 'eval \"rm v\"'",
            "trap 'rm v' EXIT",
            "busybox rm v",
        ] {
            let view = read(command);
            assert_eq!(
                view.may_run(&pattern("rm"), true),
                Fit::Yes,
                "{command:?}: {view:?}"
            );
        }
    }

    #[test]
    fn what_cannot_be_read_is_hidden_never_absent() {
        for command in [
            "$cmd v",
            "rm${IFS}v",
            "\"$(echo rm)\" v",
            "eval \"$x\"",
            "bash -c \"$x\"",
            "echo rm v | sh",
            "bash script.sh",
            "source x.sh",
            ". ./x.sh",
            "echo v | xargs rm",
            "alias x=rm",
            "hash -p /bin/rm x",
            "x='a[$(rm v)]'; (( x ))",
            "echo $((x + 1))",
            "read 'a[$(rm v)]' <<< 1",
            "echo ${!x}",
            "echo ${x@P}",
            "env -S 'rm v'",
            "if (",
        ] {
            let view = read(command);
            assert!(
                matches!(view.may_run(&pattern("rm"), true), Fit::Maybe(_) | Fit::Yes),
                "{command:?}: {view:?}"
            );
            assert!(view.not_allowable().is_some(), "{command:?}: {view:?}");
        }
        // A wrapper's dynamic argument may be the command it runs.
        let view = read("timeout 5 $x v");
        assert!(matches!(view.may_run(&pattern("rm"), true), Fit::Maybe(_)));
    }

    #[test]
    fn plain_commands_and_pipelines_are_read_whole() {
        let view = read("git log --oneline | grep -v x > /dev/null 2>&1");
        assert_eq!(view.hidden, None);
        assert_eq!(view.unallowable, None);
        assert_eq!(
            written("git log --oneline | grep -v x"),
            [lit(&["git", "log", "--oneline"]), lit(&["grep", "-v", "x"])]
        );
        assert_eq!(view.may_run(&pattern("rm"), true), Fit::No);
        assert_eq!(
            read("echo '$(rm v)'").may_run(&pattern("rm"), true),
            Fit::No
        );
        assert_eq!(read("git status").not_allowable(), None);
    }

    #[test]
    fn what_an_allow_rule_cannot_take_is_named() {
        for (command, why) in [
            ("git log > out.txt", "redirects output"),
            ("FOO=1 git status", "sets variables"),
            ("PATH=.; git status", "sets variables"),
            ("f() { :; }", "defines a function"),
        ] {
            let view = read(command);
            assert!(
                view.not_allowable().is_some_and(|w| w.contains(why)),
                "{command:?}: {view:?}"
            );
        }
    }

    #[test]
    fn patterns_fit_words_exactly_or_as_a_prefix() {
        let words = lit(&["git", "log", "-3"]);
        assert_eq!(fit(&pattern("git log"), &words, true, false), Fit::Yes);
        assert_eq!(fit(&pattern("git log"), &words, false, false), Fit::No);
        assert_eq!(fit(&pattern("git status"), &words, true, false), Fit::No);
        let dynamic = vec![Word::Literal("git".into()), Word::Dynamic];
        assert!(matches!(
            fit(&pattern("git push"), &dynamic, true, false),
            Fit::Maybe(_)
        ));
        assert_eq!(
            fit(&pattern("rm"), &lit(&["/bin/rm", "v"]), true, true),
            Fit::Yes
        );
    }

    #[test]
    fn deep_nesting_is_hidden_not_a_crash() {
        for (open, close) in [
            ("$(", ")"),
            ("{ ", ";}"),
            ("if true; then ", "; fi"),
            ("`", "`"),
        ] {
            let command = format!("{}rm v{}", open.repeat(5000), close.repeat(5000));
            let view = std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || read(&command).hidden)
                .unwrap()
                .join()
                .unwrap();
            assert!(view.is_some(), "{open}");
        }
        let long = "echo x; ".repeat(60_000);
        assert!(read(&long).hidden.is_some());
    }
}
