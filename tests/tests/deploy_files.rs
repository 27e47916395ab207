//! The files under `deploy/` (issue 10, item 7) cannot be run here (no container engine), so
//! these tests hold them to the binaries they drive: every flag they pass to `nokv-server` or
//! `nokv` is listed in the help of the (sub)command it is passed to, every `NOKV_*` variable
//! they set is one the binaries read, every TOML key is a server flag and every TOML file is
//! accepted by the server's configuration loader, and the YAML files are well-formed enough to
//! be read (no YAML parser is a dependency: a structural check stands in for one).
//!
//! How an invocation is found, in every file (comment markers stripped, Markdown only inside
//! code): a token `nokv-server` or `nokv` (or a `.../bin/`, `.../release/`, `.../debug/` path
//! to one; not after cargo's `-p`) starts it, and it runs to the end of the shell command
//! (`&&`, `||`, `;`, `|`, a `#` comment or the end of the line, `\` continuing it). In YAML, a
//! `command:`/`args:`/`entrypoint:` list is also an invocation when it starts with one of those
//! programs, or when it is the argument list of a container running the nokv image (whose
//! entrypoint is `nokv-server`).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use nokv_tests::bin;

const PROGRAMS: [&str; 2] = ["nokv-server", "nokv"];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The files under `dir`, recursively, as sorted paths relative to it.
fn files_under(dir: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                out.insert(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// Every file under `deploy/`, recursively, with its path relative to `deploy/`.
fn deploy_files() -> Vec<(String, String)> {
    let root = deploy_dir();
    let out: Vec<(String, String)> = files_under(&root)
        .into_iter()
        .map(|name| {
            let path = root.join(&name);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (name, text)
        })
        .collect();
    assert!(!out.is_empty(), "no files under {}", root.display());
    out
}

fn is_yaml(name: &str) -> bool {
    name.ends_with(".yml") || name.ends_with(".yaml")
}

// ---------------------------------------------------------------------------------------------
// Help texts

/// What one `--help` says: its options (with whether each takes a value), its subcommands
/// and the `NOKV_*` variables it names.
struct Help {
    options: HashMap<String, bool>,
    commands: BTreeSet<String>,
    env: BTreeSet<String>,
}

impl Help {
    fn parse(text: &str) -> Help {
        let mut options = HashMap::new();
        let mut commands = BTreeSet::new();
        let mut in_commands = false;
        for line in text.lines() {
            let trimmed = line.trim_start();
            if line == "Commands:" {
                in_commands = true;
                continue;
            }
            if in_commands {
                match trimmed.split_whitespace().next() {
                    Some(name) if line.starts_with("  ") => {
                        commands.insert(name.to_string());
                    }
                    _ => in_commands = false,
                }
                continue;
            }
            if trimmed.starts_with('-') {
                let mut words = trimmed.split_whitespace();
                if let Some(flag) = words.by_ref().find(|w| w.starts_with("--")) {
                    let takes_value = words.next().is_some_and(|w| w.starts_with('<'));
                    options.insert(flag.trim_end_matches(',').to_string(), takes_value);
                }
            }
        }
        Help {
            options,
            commands,
            env: env_names(text),
        }
    }
}

/// Runs `PROGRAM SUBCOMMAND... --help` once per distinct command line.
#[derive(Default)]
struct Helps(HashMap<(String, Vec<String>), Help>);

impl Helps {
    fn get(&mut self, program: &str, scope: &[String]) -> &Help {
        self.0
            .entry((program.to_string(), scope.to_vec()))
            .or_insert_with(|| {
                let out = Command::new(bin(program))
                    .args(scope)
                    .arg("--help")
                    .output()
                    .expect("run --help");
                assert!(
                    out.status.success(),
                    "{program} {} --help failed: {}",
                    scope.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
                Help::parse(&String::from_utf8(out.stdout).expect("utf-8 help"))
            })
    }
}

/// Every `NOKV_[A-Z0-9_]+` name in `text`.
fn env_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("NOKV_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        // `NOKV_*` in prose names no variable.
        if len > "NOKV_".len() {
            names.insert(tail[..len].trim_end_matches('_').to_string());
        }
        rest = &tail[len..];
    }
    names
}

// ---------------------------------------------------------------------------------------------
// Invocations

/// A command line of `program` found in a deploy file.
#[derive(Debug)]
struct Invocation {
    at: String,
    program: &'static str,
    args: Vec<String>,
}

/// `token` as a program name: `nokv-server`/`nokv` alone or as a binary's path.
fn program_of(token: &str) -> Option<&'static str> {
    let token = token.rsplit('=').next().unwrap_or(token);
    if token.contains("://") {
        return None;
    }
    let mut parts = token.rsplit('/');
    let base = parts.next()?;
    let program = PROGRAMS.into_iter().find(|p| *p == base)?;
    match parts.next() {
        None => Some(program),
        Some("bin" | "release" | "debug") => Some(program),
        Some(_) => None,
    }
}

/// The code of a file: every line for configuration files, code blocks and one-line inline
/// code spans for Markdown. Comment markers are stripped so commands in comments count.
fn code_lines(name: &str, text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    if name.ends_with(".md") {
        let mut fenced = false;
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if fenced {
                out.push((i + 1, line.to_string()));
            } else {
                for span in line.split('`').skip(1).step_by(2) {
                    out.push((i + 1, span.to_string()));
                }
            }
        }
        return out;
    }
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let code = trimmed.strip_prefix('#').unwrap_or(trimmed);
        out.push((i + 1, code.to_string()));
    }
    out
}

/// Invocations in shell-like text: each logical line (joined on a trailing `\`) split into
/// shell commands, each command starting at its first program token.
fn shell_invocations(name: &str, text: &str) -> Vec<Invocation> {
    let mut logical: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in code_lines(name, text) {
        let (start, mut joined) = pending.take().unwrap_or((n, String::new()));
        joined.push(' ');
        joined.push_str(&line);
        match joined.trim_end().strip_suffix('\\') {
            Some(head) => pending = Some((start, head.to_string())),
            None => logical.push((start, joined)),
        }
    }
    logical.extend(pending);
    let mut out = Vec::new();
    for (line, text) in logical {
        let text = text.replace("&&", "\n").replace("||", "\n");
        for command in text.split(['\n', ';', '|']) {
            let tokens: Vec<String> = command
                .split(|c: char| c.is_whitespace() || "[]\"'`(){}".contains(c))
                .map(|t| t.trim_end_matches(',').to_string())
                .filter(|t| !t.is_empty())
                .collect();
            let start = tokens.iter().enumerate().find_map(|(i, t)| {
                let after_cargo_package =
                    i > 0 && matches!(tokens[i - 1].as_str(), "-p" | "--package" | "--bin");
                program_of(t)
                    .filter(|_| !after_cargo_package)
                    .map(|p| (i, p))
            });
            if let Some((i, program)) = start {
                let args = tokens[i + 1..]
                    .iter()
                    .take_while(|t| !t.starts_with('#'))
                    .cloned()
                    .collect();
                out.push(Invocation {
                    at: format!("deploy/{name}:{line}"),
                    program,
                    args,
                });
            }
        }
    }
    out
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('"').trim_matches('\'').to_string()
}

/// The `key: value` of a YAML mapping line (also after a `- ` item marker).
fn yaml_key(line: &str) -> Option<(&str, &str)> {
    let t = line.trim_start();
    let t = t.strip_prefix("- ").unwrap_or(t);
    let (key, value) = t.split_once(':')?;
    if key.is_empty() || key.contains(' ') || key.starts_with('#') {
        return None;
    }
    Some((key, value.trim()))
}

/// The keys of the mapping containing line `at` (indent `k`): its lines at indent `k`, and the
/// `- ` item line that opens it.
fn sibling_keys<'a>(lines: &[&'a str], at: usize) -> HashMap<&'a str, &'a str> {
    let k = indent(lines[at]);
    let mut keys = HashMap::new();
    let at_k = |line: &'a str| yaml_key(line).filter(|_| indent(line) == k);
    for &line in lines[..at].iter().rev() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if indent(line) < k {
            // `- key: v` opening the mapping: its key sits at indent k too.
            if line.trim_start().starts_with("- ") && indent(line) + 2 == k {
                keys.extend(yaml_key(line));
            }
            break;
        }
        keys.extend(at_k(line));
    }
    for &line in &lines[at + 1..] {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if indent(line) < k {
            break;
        }
        keys.extend(at_k(line));
    }
    keys
}

/// The items of the YAML list that is the value of the key on line `at`: a flow list on the
/// same line, or the `- ` items below it.
fn yaml_list(lines: &[&str], at: usize) -> Vec<String> {
    let (_, value) = yaml_key(lines[at]).unwrap();
    if let Some(inner) = value.strip_prefix('[') {
        let inner = inner.trim_end().trim_end_matches(']');
        return inner.split(',').map(unquote).collect();
    }
    if !value.is_empty() {
        // A scalar command line.
        return unquote(value)
            .split_whitespace()
            .map(String::from)
            .collect();
    }
    let mut items = Vec::new();
    let mut item_indent = None;
    for &line in &lines[at + 1..] {
        if line.trim().is_empty() {
            continue;
        }
        let i = indent(line);
        if i < indent(lines[at]) || (i == indent(lines[at]) && !line.trim_start().starts_with("- "))
        {
            break;
        }
        match (line.trim_start().strip_prefix("- "), item_indent) {
            (Some(item), None) => {
                item_indent = Some(i);
                items.push(unquote(item));
            }
            (Some(item), Some(at_indent)) if at_indent == i => items.push(unquote(item)),
            (_, Some(at_indent)) if i > at_indent => {} // a block scalar's lines
            _ => break,
        }
    }
    items
}

/// An image is nokv's when its name (last path segment, without the tag) is `nokv`.
fn is_nokv_image(image: &str) -> bool {
    let image = unquote(image);
    let last = image.rsplit('/').next().unwrap_or(&image);
    last.split(':').next() == Some("nokv")
}

/// Argument lists of YAML containers: lists starting with a program, and the arguments of
/// the nokv image's entrypoint (`nokv-server`). Kubernetes: `command` replaces the entrypoint,
/// `args` are its arguments. Compose: `entrypoint` replaces it, `command` are its arguments.
fn yaml_invocations(name: &str, text: &str) -> Vec<Invocation> {
    let lines: Vec<&str> = text.lines().collect();
    let kubernetes = text.lines().any(|l| l.starts_with("apiVersion:"));
    let (replaces, arguments) = if kubernetes {
        ("command", "args")
    } else {
        ("entrypoint", "command")
    };
    let mut out = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let Some((key, _)) = yaml_key(line) else {
            continue;
        };
        if key != replaces && key != arguments {
            continue;
        }
        let items = yaml_list(&lines, at);
        let siblings = sibling_keys(&lines, at);
        let invocation = match items.first().and_then(|first| program_of(first)) {
            Some(program) => Some((program, items[1..].to_vec())),
            None if key == arguments
                && !siblings.contains_key(replaces)
                && siblings.get("image").is_some_and(|i| is_nokv_image(i)) =>
            {
                Some(("nokv-server", items))
            }
            None => None,
        };
        if let Some((program, args)) = invocation {
            out.push(Invocation {
                at: format!("deploy/{name}:{}", at + 1),
                program,
                args,
            });
        }
    }
    out
}

fn all_invocations() -> Vec<Invocation> {
    let mut out = Vec::new();
    for (name, text) in deploy_files() {
        out.extend(shell_invocations(&name, &text));
        if is_yaml(&name) {
            out.extend(yaml_invocations(&name, &text));
        }
    }
    out
}

/// The flags of `inv` that its command does not list, as messages, and the flags it used
/// (`program subcommand... --flag`). Subcommands are followed while the words after the
/// program name them; a flag's value (`--flag value`, `--flag=value`) is skipped.
fn check(helps: &mut Helps, inv: &Invocation) -> (Vec<String>, Vec<String>) {
    let (mut bad, mut used) = (Vec::new(), Vec::new());
    let mut scope: Vec<String> = Vec::new();
    let mut descending = true;
    let mut args = inv.args.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        let command = format!("{} {}", inv.program, scope.join(" "));
        let command = command.trim_end();
        if let Some(flag) = arg.strip_prefix("--") {
            let (flag, inline_value) = match flag.split_once('=') {
                Some((f, _)) => (f, true),
                None => (flag, false),
            };
            let flag = format!("--{flag}");
            match helps.get(inv.program, &scope).options.get(&flag) {
                None => bad.push(format!(
                    "{}: `{command}` has no {flag} (see `{command} --help`)",
                    inv.at
                )),
                Some(&takes_value) => {
                    used.push(format!("{command} {flag}"));
                    if takes_value && !inline_value {
                        args.next();
                    }
                }
            }
        } else if descending && !arg.starts_with('-') {
            if helps.get(inv.program, &scope).commands.contains(arg) {
                scope.push(arg.clone());
            } else {
                descending = false;
            }
        }
    }
    (bad, used)
}

#[test]
fn every_flag_used_in_deploy_files_exists_in_the_help_of_the_command_it_is_passed_to() {
    let mut helps = Helps::default();
    let (mut bad, mut used) = (Vec::new(), BTreeSet::new());
    for inv in all_invocations() {
        let (b, u) = check(&mut helps, &inv);
        bad.extend(b);
        used.extend(u);
    }
    assert!(bad.is_empty(), "unknown flags:\n{}", bad.join("\n"));
    // The extraction must see the invocations that matter, or the check above proves nothing:
    // the compose nodes and the StatefulSet (image entrypoint), the unit and the init service.
    for expected in [
        "nokv-server --etcd",
        "nokv-server --advertise",
        "nokv-server --tls-dir",
        "nokv-server --node-id",
        "nokv-server --s3-allow-http",
        "nokv-server --config",
        "nokv-server cluster init --dir",
        "nokv-server cluster init --host",
        "nokv --endpoint",
        // The probes of the StatefulSet and the compose healthchecks.
        "nokv-server probe --ca",
        "nokv-server probe --server-name",
        "nokv-server probe --answering",
    ] {
        assert!(
            used.contains(expected),
            "no `{expected}` found in deploy/ (extraction broke?); found: {used:?}"
        );
    }
}

#[test]
fn a_flag_the_server_does_not_have_is_reported_with_its_file_and_line() {
    let compose = "services:\n  node:\n    image: nokv:dev\n    command:\n      - --etcd=http://e:2379\n      - --no-such-flag\n  init:\n    image: nokv:dev\n    entrypoint: [\"sh\", \"-c\", \"exec nokv-server cluster init --dir /c --listen x\"]\n";
    let mut helps = Helps::default();
    let mut bad = Vec::new();
    for inv in yaml_invocations("x.yml", compose)
        .iter()
        .chain(&shell_invocations("x.yml", compose))
    {
        bad.extend(check(&mut helps, inv).0);
    }
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(
        bad.iter()
            .any(|b| b.starts_with("deploy/x.yml:4:") && b.contains("--no-such-flag")),
        "{bad:?}"
    );
    // --listen is a serve flag, not one of `cluster init`.
    assert!(
        bad.iter()
            .any(|b| b.contains("`nokv-server cluster init` has no --listen")),
        "{bad:?}"
    );
}

#[test]
fn every_nokv_environment_variable_in_deploy_files_is_one_the_binaries_read() {
    let mut helps = Helps::default();
    let mut known = helps.get("nokv-server", &[]).env.clone();
    known.extend(helps.get("nokv", &[]).env.clone());
    // Read when the binaries are built, not when they run (nokv_build_info's commit).
    known.insert("NOKV_COMMIT".to_string());
    assert!(known.contains("NOKV_ETCD") && known.contains("NOKV_ENDPOINT"));
    let mut used = BTreeSet::new();
    let mut bad = Vec::new();
    for (name, text) in deploy_files() {
        for var in env_names(&text) {
            if !known.contains(&var) {
                bad.push(format!("deploy/{name}: {var}"));
            }
            used.insert(var);
        }
    }
    assert!(
        bad.is_empty(),
        "variables no binary reads:\n{}",
        bad.join("\n")
    );
    assert!(
        used.contains("NOKV_ETCD"),
        "the k8s ConfigMap sets NOKV_ETCD"
    );
}

fn toml_files() -> Vec<(String, String)> {
    let files: Vec<_> = deploy_files()
        .into_iter()
        .filter(|(name, _)| name.ends_with(".toml"))
        .collect();
    assert!(
        files.iter().any(|(n, _)| n == "cluster-node.toml"),
        "deploy/cluster-node.toml is missing"
    );
    files
}

#[test]
fn every_key_of_every_deploy_toml_file_is_a_flag_in_the_server_help() {
    let mut helps = Helps::default();
    let options = &helps.get("nokv-server", &[]).options;
    let mut bad = Vec::new();
    for (name, text) in toml_files() {
        let table: toml::Table =
            toml::from_str(&text).unwrap_or_else(|e| panic!("deploy/{name}: {e}"));
        assert!(!table.is_empty(), "deploy/{name} sets nothing");
        for (key, value) in &table {
            let flag = format!("--{}", key.replace('_', "-"));
            if !options.contains_key(&flag) {
                bad.push(format!(
                    "deploy/{name}: {key} (no {flag} in nokv-server --help)"
                ));
            }
            if value.is_table() {
                bad.push(format!(
                    "deploy/{name}: [{key}] (the server reads no tables)"
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "keys the server does not take:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_deploy_toml_file_is_accepted_by_the_server_configuration_loader() {
    for (name, text) in toml_files() {
        // The same deserialisation (unknown keys refused) and validation `--config` goes
        // through, without flags or environment on top.
        let args: nokv_server::config::ServeArgs =
            toml::from_str(&text).unwrap_or_else(|e| panic!("deploy/{name}: {e}"));
        let settings = args
            .resolve()
            .unwrap_or_else(|e| panic!("deploy/{name}: {e}"));
        if name == "cluster-node.toml" {
            let cluster = settings
                .cluster
                .unwrap_or_else(|| panic!("deploy/{name} is not a cluster node (no etcd)"));
            assert!(cluster.advertise.ends_with(":7878"), "{cluster:?}");
        }
    }
}

/// Top-level keys each kind of YAML file must have.
fn required_top_level(name: &str) -> &'static [&'static str] {
    if name.starts_with("k8s/") {
        &["apiVersion", "kind", "metadata"]
    } else {
        &["services"]
    }
}

#[test]
fn every_deploy_yaml_file_has_no_tabs_consistent_indentation_and_the_top_level_keys_of_its_kind() {
    let yaml: Vec<_> = deploy_files()
        .into_iter()
        .filter(|(name, _)| is_yaml(name))
        .collect();
    assert!(yaml.iter().any(|(n, _)| n == "docker-compose.yml"));
    assert!(yaml.iter().any(|(n, _)| n == "k8s/statefulset.yaml"));
    let mut bad = Vec::new();
    let mut kinds = BTreeSet::new();
    for (name, text) in &yaml {
        let mut top = BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let at = format!("deploy/{name}:{}", i + 1);
            if line.contains('\t') {
                bad.push(format!("{at}: tab"));
            }
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            if !indent(line).is_multiple_of(2) {
                bad.push(format!("{at}: odd indentation"));
            }
            let t = line.trim();
            if t.matches('[').count() != t.matches(']').count()
                || t.matches('{').count() != t.matches('}').count()
            {
                bad.push(format!("{at}: unbalanced flow brackets"));
            }
            if indent(line) == 0 {
                match yaml_key(line) {
                    Some((key, value)) => {
                        if key == "kind" {
                            kinds.insert(value.to_string());
                        }
                        if !top.insert(key.to_string()) {
                            bad.push(format!("{at}: duplicate top-level key {key}"));
                        }
                    }
                    None if t == "---" => {}
                    None => bad.push(format!("{at}: not a `key:` line")),
                }
            }
        }
        for key in required_top_level(name) {
            if !top.contains(*key) {
                bad.push(format!("deploy/{name}: no top-level {key}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    for kind in ["Service", "StatefulSet", "ConfigMap", "Secret"] {
        assert!(kinds.contains(kind), "no {kind} in deploy/k8s: {kinds:?}");
    }
}

/// The value of `--flag` in `args` (`--flag=v` or `--flag v`), every occurrence.
fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            out.extend(it.next().map(String::as_str));
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v);
        }
    }
    out
}

#[test]
fn every_compose_node_advertises_a_host_cluster_init_made_a_certificate_for_under_its_own_id() {
    let text = std::fs::read_to_string(deploy_dir().join("docker-compose.yml")).unwrap();
    let invocations: Vec<Invocation> = shell_invocations("docker-compose.yml", &text)
        .into_iter()
        .chain(yaml_invocations("docker-compose.yml", &text))
        .collect();
    let init = invocations
        .iter()
        .find(|i| i.args.starts_with(&["cluster".into(), "init".into()]))
        .expect("a `nokv-server cluster init` in docker-compose.yml");
    let hosts: BTreeSet<&str> = values(&init.args, "--host").into_iter().collect();
    let tls_dir = values(&init.args, "--dir")[0];
    let nodes: Vec<&Invocation> = invocations
        .iter()
        .filter(|i| i.program == "nokv-server" && !values(&i.args, "--etcd").is_empty())
        .collect();
    assert_eq!(nodes.len(), 3, "three nodes: {nodes:?}");
    let mut ids = BTreeSet::new();
    for node in nodes {
        let advertise = values(&node.args, "--advertise");
        let host = advertise[0]
            .rsplit_once(':')
            .map_or(advertise[0], |(h, _)| h);
        assert!(hosts.contains(host), "{}: {host} not in {hosts:?}", node.at);
        assert_eq!(values(&node.args, "--tls-dir"), [tls_dir], "{}", node.at);
        assert!(
            ids.insert(values(&node.args, "--node-id")[0]),
            "{}",
            node.at
        );
        assert_eq!(values(&node.args, "--cluster"), ["demo"], "{}", node.at);
    }
}

/// Mutation: put `http://` back in one compose node's `--etcd`, or drop its `--etcd-cert`, or
/// the ConfigMap's `NOKV_ETCD_KEY`, or `etcd_ca` from cluster-node.toml.
#[test]
fn every_deploy_cluster_node_reaches_etcd_over_https_with_a_ca_and_a_client_certificate() {
    let compose = std::fs::read_to_string(deploy_dir().join("docker-compose.yml")).unwrap();
    let invocations: Vec<Invocation> = shell_invocations("docker-compose.yml", &compose)
        .into_iter()
        .chain(yaml_invocations("docker-compose.yml", &compose))
        .collect();
    let init = invocations
        .iter()
        .find(|i| i.args.starts_with(&["cluster".into(), "init".into()]))
        .expect("a `nokv-server cluster init` in docker-compose.yml");
    let tls_dir = values(&init.args, "--dir")[0];
    assert!(
        values(&init.args, "--etcd-host").contains(&"etcd"),
        "cluster init makes etcd's certificate for the name nodes dial: {init:?}"
    );
    let nodes: Vec<&Invocation> = invocations
        .iter()
        .filter(|i| i.program == "nokv-server" && !values(&i.args, "--etcd").is_empty())
        .collect();
    assert_eq!(nodes.len(), 3, "three nodes: {nodes:?}");
    for node in nodes {
        for url in values(&node.args, "--etcd")[0].split(',') {
            assert!(url.starts_with("https://"), "{}: {url}", node.at);
        }
        for (flag, file) in [
            ("--etcd-ca", "ca.pem"),
            ("--etcd-cert", "etcd/client.pem"),
            ("--etcd-key", "etcd/client.key"),
        ] {
            assert_eq!(
                values(&node.args, flag),
                [format!("{tls_dir}/{file}")],
                "{}",
                node.at
            );
        }
    }
    // The etcd service itself: TLS only, client certificates demanded, trusting the cluster CA.
    for setting in [
        "ETCD_LISTEN_CLIENT_URLS: https://",
        "ETCD_ADVERTISE_CLIENT_URLS: https://etcd:2379",
        "ETCD_CLIENT_CERT_AUTH: \"true\"",
        &format!("ETCD_TRUSTED_CA_FILE: {tls_dir}/ca.pem"),
        &format!("ETCD_CERT_FILE: {tls_dir}/etcd/server.pem"),
        &format!("ETCD_KEY_FILE: {tls_dir}/etcd/server.key"),
    ] {
        assert!(
            compose.contains(setting),
            "docker-compose.yml: no {setting}"
        );
    }
    assert!(
        !compose.contains("http://etcd"),
        "plain http to etcd remains"
    );

    let configmap = std::fs::read_to_string(deploy_dir().join("k8s/configmap.yaml")).unwrap();
    let setting = |name: &str| {
        configmap.lines().find_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            (k == name).then(|| v.trim().trim_matches('"').to_string())
        })
    };
    let etcd = setting("NOKV_ETCD").expect("NOKV_ETCD in the ConfigMap");
    assert!(etcd.split(',').all(|u| u.starts_with("https://")), "{etcd}");
    let statefulset = std::fs::read_to_string(deploy_dir().join("k8s/statefulset.yaml")).unwrap();
    for name in ["NOKV_ETCD_CA", "NOKV_ETCD_CERT", "NOKV_ETCD_KEY"] {
        let path = setting(name).unwrap_or_else(|| panic!("{name} in the ConfigMap"));
        let dir = path.rsplit_once('/').unwrap().0;
        assert!(
            statefulset.contains(&format!("mountPath: {dir}")),
            "{name}={path}: nothing is mounted at {dir} in the StatefulSet"
        );
    }

    let text = std::fs::read_to_string(deploy_dir().join("cluster-node.toml")).unwrap();
    let args: nokv_server::config::ServeArgs = toml::from_str(&text).unwrap();
    let cluster = args.resolve().unwrap().cluster.unwrap();
    assert!(cluster.etcd.iter().all(|u| u.starts_with("https://")));
    let access = &cluster.etcd_access;
    assert!(access.ca.is_some() && access.cert.is_some() && access.key.is_some());
}

// ---------------------------------------------------------------------------------------------
// Issue 47, section 4: metrics on everywhere, Kubernetes probes and resources, no admin token in
// node pods.

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy_dir().join(name))
        .unwrap_or_else(|e| panic!("deploy/{name}: {e}"))
}

/// The lines of `text` that are not comments (YAML, TOML, shell, Dockerfile).
fn uncommented(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect()
}

/// Mutation: drop `metrics_listen` from a TOML file, `--metrics-listen` from one compose node,
/// `NOKV_METRICS_LISTEN` from the ConfigMap or the Dockerfile, or the unit's `--config`.
#[test]
fn every_deploy_file_that_starts_a_node_turns_metrics_on() {
    // The TOML files, as the server loads them (the systemd unit reads cluster-node.toml).
    for (name, text) in toml_files() {
        let args: nokv_server::config::ServeArgs = toml::from_str(&text).unwrap();
        let settings = args.resolve().unwrap();
        assert!(
            settings.metrics_listen.is_some(),
            "deploy/{name}: no metrics_listen"
        );
    }
    let unit = read("nokv-server.service");
    let exec = unit
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .expect("an ExecStart");
    let config = exec
        .split_whitespace()
        .skip_while(|w| *w != "--config")
        .nth(1)
        .expect("the unit starts the node with --config");
    let config = config.rsplit('/').next().unwrap();
    assert!(
        toml_files().iter().any(|(n, _)| n == config),
        "the unit's {config} is not a deploy/ TOML file (checked above)"
    );
    // Every compose node passes the flag and exposes the port.
    let compose = read("docker-compose.yml");
    let nodes: Vec<Invocation> = yaml_invocations("docker-compose.yml", &compose)
        .into_iter()
        .filter(|i| !values(&i.args, "--etcd").is_empty())
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    for node in &nodes {
        assert_eq!(
            values(&node.args, "--metrics-listen"),
            ["0.0.0.0:9464"],
            "{}",
            node.at
        );
    }
    assert_eq!(
        compose.matches("expose: [\"9464\"]").count(),
        3,
        "every compose node exposes 9464"
    );
    // Kubernetes: the ConfigMap turns it on, the pods name the port, the Service exposes it,
    // and Prometheus is told to scrape it (annotations; a ServiceMonitor for the operator).
    let configmap = read("k8s/configmap.yaml");
    assert!(
        configmap.contains("NOKV_METRICS_LISTEN: \"0.0.0.0:9464\""),
        "{configmap}"
    );
    let statefulset = read("k8s/statefulset.yaml");
    for needle in [
        "- name: metrics\n              containerPort: 9464",
        "prometheus.io/scrape: \"true\"",
        "prometheus.io/port: \"9464\"",
    ] {
        assert!(
            statefulset.contains(needle),
            "statefulset.yaml: no {needle}"
        );
    }
    let service = read("k8s/service.yaml");
    assert!(
        service.contains("- name: metrics\n      port: 9464\n      targetPort: metrics"),
        "{service}"
    );
    let monitor = read("k8s/monitoring/servicemonitor.yaml");
    assert!(
        monitor.contains("kind: ServiceMonitor") && monitor.contains("- port: metrics"),
        "{monitor}"
    );
    // The image: on by default, port declared.
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.contains("NOKV_METRICS_LISTEN=0.0.0.0:9464"));
    assert!(
        uncommented(&dockerfile)
            .iter()
            .any(|l| l.starts_with("EXPOSE") && l.contains("9464")),
        "the Dockerfile exposes 9464"
    );
}

/// The `key:` block that starts at the line `key:` (indent included) in `text`, up to the next
/// line indented as little.
fn yaml_block<'a>(text: &'a str, key: &str) -> Option<Vec<&'a str>> {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start() == format!("{key}:"))?;
    let k = indent(lines[at]);
    Some(
        lines[at + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || indent(l) > k)
            .copied()
            .collect(),
    )
}

/// Mutation: go back to the `tcpSocket` readiness check, drop the liveness probe, drop
/// `--answering` from it (a full disk would restart the pod), or drop a limit.
#[test]
fn the_statefulset_probes_grpc_health_over_tls_and_sets_resource_requests_and_limits() {
    let statefulset = read("k8s/statefulset.yaml");
    let probe_command = |probe: &str| -> String {
        let block = yaml_block(&statefulset, probe).unwrap_or_else(|| panic!("no {probe}"));
        let line = block
            .iter()
            .find(|l| l.trim_start().starts_with("command:"))
            .unwrap_or_else(|| panic!("{probe} is not an exec probe: {block:?}"));
        line.to_string()
    };
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        let command = probe_command(probe);
        assert!(
            command.contains("nokv-server probe") && command.contains("--ca /cluster/ca.pem"),
            "{probe}: {command}"
        );
        // Checked under the advertised name, the one the certificate has.
        assert!(
            command.contains("--server-name $POD_NAME.nokv.$POD_NAMESPACE.svc.cluster.local"),
            "{probe}: {command}"
        );
    }
    assert!(!probe_command("readinessProbe").contains("--answering"));
    assert!(probe_command("livenessProbe").contains("--answering"));
    assert!(!statefulset.contains("tcpSocket"));
    let resources = yaml_block(&statefulset, "resources").expect("resources");
    let resources = resources.join("\n");
    for (part, keys) in [
        ("requests", ["cpu", "memory"]),
        ("limits", ["cpu", "memory"]),
    ] {
        let block = yaml_block(&resources, part)
            .unwrap_or_else(|| panic!("no resources.{part}: {resources}"));
        for key in keys {
            assert!(
                block
                    .iter()
                    .any(|l| l.trim_start().starts_with(&format!("{key}:"))),
                "no resources.{part}.{key}"
            );
        }
    }
}

/// Mutation: put `admin.token` back into the init container's copy, or into the README's
/// `nokv-cluster` Secret.
#[test]
fn no_node_pod_gets_the_admin_token_and_operators_get_it_from_a_secret_of_its_own() {
    let statefulset = read("k8s/statefulset.yaml");
    let bad: Vec<&str> = uncommented(&statefulset)
        .into_iter()
        .filter(|l| l.contains("admin"))
        .collect();
    assert!(bad.is_empty(), "statefulset.yaml: {bad:?}");
    // The README's commands: the Secret every pod mounts holds no admin token; the operators'
    // Secret holds only that.
    let readme = read("README.md");
    let commands = shell_logical_lines(&readme);
    let cluster_secret = commands
        .iter()
        .find(|c| c.contains("create secret generic nokv-cluster"))
        .expect("the README creates the nokv-cluster Secret");
    assert!(
        cluster_secret.contains("ca.pem") && cluster_secret.contains("cluster.secret"),
        "{cluster_secret}"
    );
    assert!(!cluster_secret.contains("admin"), "{cluster_secret}");
    let admin_secret = commands
        .iter()
        .find(|c| c.contains("admin.token"))
        .expect("the README puts the admin token somewhere");
    assert!(
        admin_secret.contains("create secret generic nokv-admin"),
        "{admin_secret}"
    );
    assert!(
        !statefulset.contains("nokv-admin"),
        "no pod mounts the admin Secret"
    );
}

/// The README's code lines joined on trailing `\`.
fn shell_logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for (_, line) in code_lines("README.md", text) {
        if line.trim_start().starts_with('#') {
            continue;
        }
        pending.push(' ');
        pending.push_str(&line);
        match pending.trim_end().strip_suffix('\\') {
            Some(head) => pending = head.to_string(),
            None => out.push(std::mem::take(&mut pending)),
        }
    }
    out
}

#[test]
fn the_readme_says_a_bare_docker_run_needs_advertise_for_its_certificate() {
    let readme = read("README.md");
    let run = shell_logical_lines(&readme)
        .into_iter()
        .find(|l| l.contains("docker run -"))
        .expect("a docker run example");
    assert!(run.contains("--advertise "), "{run}");
    assert!(
        readme.contains("names `localhost`") && readme.contains("`--advertise` host"),
        "the README explains why"
    );
}

/// `nokv-server probe`, as the StatefulSet and compose run it, against a real daemon.
#[test]
fn the_probe_passes_on_a_serving_daemon_and_fails_under_a_wrong_name_or_once_it_stopped() {
    let d = nokv_tests::Daemon::start(&[]);
    // A copy: the daemon's data dir goes with it.
    let kept = tempfile::tempdir().unwrap();
    let ca = kept.path().join("ca.pem");
    std::fs::copy(d.ca_path(), &ca).unwrap();
    let probe = |extra: &[&str]| {
        Command::new(bin("nokv-server"))
            .arg("probe")
            .arg("--ca")
            .arg(&ca)
            .args(["--endpoint", &d.endpoint()])
            .args(extra)
            .output()
            .expect("run nokv-server probe")
    };
    let ok = probe(&[]);
    assert!(ok.status.success(), "{ok:?}");
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("SERVING"),
        "{ok:?}"
    );
    // Dialled by address, checked under a name the development certificate has.
    let named = probe(&["--server-name", "localhost"]);
    assert!(named.status.success(), "{named:?}");
    let wrong = probe(&["--server-name", "not-this-node.example"]);
    assert_eq!(wrong.status.code(), Some(1), "{wrong:?}");
    let endpoint = d.endpoint();
    assert!(d.terminate().success());
    let stopped = Command::new(bin("nokv-server"))
        .args(["probe", "--answering", "--endpoint", &endpoint, "--ca"])
        .arg(&ca)
        .output()
        .unwrap();
    assert_eq!(stopped.status.code(), Some(1), "{stopped:?}");
    let said = String::from_utf8_lossy(&stopped.stderr);
    assert!(
        said.contains(&endpoint) && !said.contains("ca.pem"),
        "{said}"
    );
}

/// The first YAML block scalar that is a list item (`- |`): an init script, its lines
/// dedented (the scripts here are flat: no line depends on its indentation).
fn script_block(yaml: &str) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim() == "- |")
        .expect("an init script (`- |`)");
    lines[at + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || indent(l) > indent(lines[at]))
        .map(|l| format!("{}\n", l.trim()))
        .collect()
}

/// The StatefulSet's init-container script, run as shipped (its `/cluster-secret` and
/// `/cluster` moved under `root`): from a flat Secret holding what the README puts in
/// `nokv-cluster` (no admin token), it must lay out a `--tls-dir` a node serves from — and the
/// probe the pod runs must pass against it.
#[test]
fn the_init_container_lays_out_a_tls_dir_without_the_admin_token_that_a_node_serves_from() {
    let script = script_block(&read("k8s/statefulset.yaml"));
    let root = tempfile::tempdir().unwrap();
    let (secret, tls) = (root.path().join("secret"), root.path().join("cluster"));
    // Absolute paths only: `/cluster` after a blank or a quote (not in `/cluster.secret`).
    let mut script = script;
    for quote in [" ", "\""] {
        script = script
            .replace(
                &format!("{quote}/cluster-secret"),
                &format!("{quote}{}", secret.display()),
            )
            .replace(
                &format!("{quote}/cluster"),
                &format!("{quote}{}", tls.display()),
            );
    }
    // `cluster init`, then the Secret as the README creates it: ca.pem, cluster.secret and
    // every file of nodes/, flat.
    let host = "nokv-0.nokv.ns.svc.cluster.local";
    let made = root.path().join("made");
    let init = Command::new(bin("nokv-server"))
        .args([
            "cluster",
            "init",
            "--dir",
            made.to_str().unwrap(),
            "--host",
            host,
        ])
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    std::fs::create_dir(&secret).unwrap();
    for file in ["ca.pem", "cluster.secret"] {
        std::fs::copy(made.join(file), secret.join(file)).unwrap();
    }
    for entry in std::fs::read_dir(made.join("nodes")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), secret.join(entry.file_name())).unwrap();
    }
    let laid_out = Command::new("sh")
        .args(["-c", &script])
        .env("POD_NAME", "nokv-0")
        .env("POD_NAMESPACE", "ns")
        .output()
        .unwrap();
    assert!(laid_out.status.success(), "{laid_out:?}\n{script}");
    assert!(!tls.join("admin.token").exists());

    // The node chooses its certificate by its id here (no DNS for the advertised name).
    let d = nokv_tests::Daemon::start(&["--tls-dir", tls.to_str().unwrap(), "--node-id", host]);
    let client = std::fs::read_to_string(d.data_dir().join("client.toml")).unwrap();
    assert!(!client.lines().any(|l| l.starts_with("token")), "{client}");
    let probe = Command::new(bin("nokv-server"))
        .args([
            "probe",
            "--endpoint",
            &d.endpoint(),
            "--server-name",
            host,
            "--ca",
        ])
        .arg(tls.join("ca.pem"))
        .output()
        .unwrap();
    assert!(probe.status.success(), "{probe:?}");
}

/// The compose file's services, each name with its text (its key line through its last
/// indented line).
fn compose_services(compose: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_services = false;
    for line in compose.lines() {
        if indent(line) == 0 && !line.trim().is_empty() {
            in_services = line == "services:";
        } else if in_services && indent(line) == 2 && line.trim_end().ends_with(':') {
            let name = line.trim().trim_end_matches(':').to_string();
            out.push((name, format!("{line}\n")));
        } else if let Some((_, text)) = out.last_mut().filter(|_| in_services) {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

/// The compose `init` service's script, run as shipped (its `/cluster` moved under a temporary
/// root, compose's `$$` back to the shell's `$`), twice: each node's directory holds exactly
/// the CA certificate, the token secret, its own key and the etcd client certificate, and
/// etcd's exactly the CA certificate and its keys — the CA's private key, the admin token and
/// the other nodes' keys stay in `tls/`, which only `init` and the operators' `cli` mount.
/// Then a real etcd serves from `etcd/` demanding client certificates, and a node started with
/// the compose node's own flags and `node1/` alone joins it and answers the compose health
/// check. Mutation: copy `ca.key` or `admin.token` into a node's directory, leave
/// `cluster.secret` out of it, or mount the whole volume into a node service.
#[test]
fn the_compose_init_gives_each_reader_a_tls_dir_of_its_own_from_which_etcd_serves_and_a_node_joins()
{
    let compose = read("docker-compose.yml");
    let root = tempfile::tempdir().unwrap();
    let cluster = root.path().join("cluster");
    std::fs::create_dir(&cluster).unwrap();
    let script = script_block(&compose)
        .replace("$$", "$")
        .replace(" /cluster", &format!(" {}", cluster.display()));
    let bin_dir = bin("nokv-server").parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for run in ["first", "second"] {
        let laid_out = Command::new("sh")
            .args(["-ec", &script])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            laid_out.status.success(),
            "{run} run: {laid_out:?}\n{script}"
        );
    }

    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|n| n.to_string()).collect() };
    for node in ["node1", "node2", "node3"] {
        let want = set(&[
            "ca.pem",
            "cluster.secret",
            &format!("nodes/{node}.pem"),
            &format!("nodes/{node}.key"),
            "etcd/client.pem",
            "etcd/client.key",
        ]);
        assert_eq!(files_under(&cluster.join(node)), want, "{node}");
    }
    let want = set(&[
        "ca.pem",
        "etcd/server.pem",
        "etcd/server.key",
        "etcd/client.pem",
        "etcd/client.key",
    ]);
    assert_eq!(files_under(&cluster.join("etcd")), want, "etcd");

    // Who mounts what: each reader its own subdirectory, read-only, as its /cluster/tls; the
    // whole volume only `init` (which writes it) and `cli` (the operators').
    let services = compose_services(&compose);
    for reader in ["etcd", "node1", "node2", "node3"] {
        let (_, service) = services
            .iter()
            .find(|(name, _)| name == reader)
            .unwrap_or_else(|| panic!("service {reader} in docker-compose.yml"));
        for line in [
            "source: cluster",
            "target: /cluster/tls",
            "read_only: true",
            &format!("volume: {{ subpath: {reader} }}"),
        ] {
            assert!(service.contains(line), "{reader}: no `{line}`\n{service}");
        }
    }
    for (name, service) in &services {
        assert!(
            !service.contains("cluster:/cluster") || name == "init" || name == "cli",
            "{name} mounts the whole cluster volume"
        );
    }

    // etcd from its directory, with the settings the compose etcd service gives it.
    let etcd_dir = cluster.join("etcd");
    let etcd = nokv_tests::Etcd::start_tls(&nokv_tests::EtcdServerTls {
        trusted_ca: etcd_dir.join("ca.pem"),
        cert: etcd_dir.join("etcd/server.pem"),
        key: etcd_dir.join("etcd/server.key"),
    });
    let moto = nokv_tests::Moto::start();
    moto.create_bucket("nokv");

    // node1 with the compose service's own arguments, the compose host names and ports
    // replaced by loopback ones, its data dir by a temporary one.
    let node = yaml_invocations("docker-compose.yml", &compose)
        .into_iter()
        .find(|i| i.args.iter().any(|a| a == "--node-id=node1"))
        .expect("node1's command");
    let ports = nokv_tests::free_ports(2);
    let node_dir = cluster.join("node1");
    let mut args: Vec<String> = Vec::new();
    for arg in &node.args {
        let Some((flag, value)) = arg.split_once('=') else {
            args.push(arg.clone());
            continue;
        };
        let value = match flag {
            "--data-dir" => continue,
            "--listen" => format!("127.0.0.1:{}", ports[0]),
            "--advertise" => format!("node1:{}", ports[0]),
            "--metrics-listen" => format!("127.0.0.1:{}", ports[1]),
            "--etcd" => etcd.endpoint(),
            "--s3-endpoint" => moto.endpoint(),
            _ => value.replace("/cluster/tls", node_dir.to_str().unwrap()),
        };
        args.extend([flag.to_string(), value]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let data = root.path().join("node1-data");
    let mut d = nokv_tests::Daemon::start_in_with_env(
        &data,
        &args,
        &[
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
        ],
    );
    // Logged before it listens, but stderr is drained apart from stdout: wait for the line.
    d.wait_for_log_line("joined the cluster");
    // The compose health check, against this node's port.
    let probe = Command::new(bin("nokv-server"))
        .args([
            "probe",
            "--endpoint",
            &format!("https://127.0.0.1:{}", ports[0]),
            "--server-name",
            "node1",
            "--ca",
        ])
        .arg(node_dir.join("ca.pem"))
        .output()
        .unwrap();
    assert!(probe.status.success(), "{probe:?}\n{}", d.stderr());
}
