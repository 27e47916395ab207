//! The agent operations the server does in one round trip: edit, append, find, grep.

use std::collections::HashSet;
use std::path::PathBuf;

use nokv_client::sdk::new_request_id;
use nokv_client::{Client, ClientError};
use nokv_proto::v1 as pb;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use super::output::{Output, entry_json, human_bytes, plural};
use super::target::Target;

/// Find's page size when the caller set no `--limit` (the server's maximum: fewest round
/// trips).
const FIND_PAGE: u32 = 1000;

pub async fn edit(
    client: &Client,
    out: Output,
    t: &Target,
    old: String,
    new: String,
    if_generation: Option<u64>,
    request_id: Option<String>,
) -> Result<(), ClientError> {
    let request_id = request_id.unwrap_or_else(new_request_id);
    let e = client
        .edit(pb::EditRequest {
            workspace: t.workspace.clone(),
            path: t.path.clone(),
            old,
            new,
            expected_generation: if_generation.unwrap_or(0),
            request_id: request_id.clone(),
        })
        .await
        .map_err(|e| e.with_retry_hint(&request_id))?;
    out.emit(entry_json(&e), || {
        format!("edited {t} (generation {})", e.generation)
    });
    Ok(())
}

pub async fn append(
    client: &Client,
    out: Output,
    t: &Target,
    file: Option<PathBuf>,
    request_id: Option<String>,
) -> Result<(), ClientError> {
    let data = match file {
        Some(p) if p.as_os_str() != "-" => {
            std::fs::read(&p).map_err(|e| ClientError::local(format!("{}: {e}", p.display())))?
        }
        _ => {
            let mut data = Vec::new();
            tokio::io::stdin()
                .read_to_end(&mut data)
                .await
                .map_err(|e| ClientError::local(format!("stdin: {e}")))?;
            data
        }
    };
    let request_id = request_id.unwrap_or_else(new_request_id);
    let appended = data.len() as u64;
    let e = client
        .append(pb::AppendRequest {
            workspace: t.workspace.clone(),
            path: t.path.clone(),
            data,
            request_id: request_id.clone(),
        })
        .await
        .map_err(|e| e.with_retry_hint(&request_id))?;
    out.emit(entry_json(&e), || {
        format!(
            "appended {} to {t} (now {}, generation {})",
            human_bytes(appended),
            human_bytes(e.size),
            e.generation
        )
    });
    Ok(())
}

/// Every matching entry, or the first `limit` of them.
pub async fn find(
    client: &Client,
    out: Output,
    t: &Target,
    limit: Option<u32>,
) -> Result<(), ClientError> {
    // A bare workspace (or `WS:`) means every path in it.
    let glob = if t.path.is_empty() { "**" } else { &t.path };
    let want = limit.map_or(usize::MAX, |n| n as usize);
    let page_size = limit.map_or(FIND_PAGE, |n| n.min(FIND_PAGE));
    let mut entries = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = client.find(&t.workspace, glob, page_size, &cursor).await?;
        entries.extend(page.entries);
        cursor = page.next_cursor;
        if cursor.is_empty() || entries.len() >= want {
            break;
        }
    }
    entries.truncate(want);
    if entries.is_empty() && !out.json {
        hint_if_a_directory_was_meant("no path is", &t.workspace, glob);
    }
    out.emit(
        json!({"entries": entries.iter().map(entry_json).collect::<Vec<_>>()}),
        || {
            entries
                .iter()
                .map(|e| e.path.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    Ok(())
}

/// A glob without wildcards names exactly one path, so `WS:notes` finds nothing when `notes`
/// is a directory, and says nothing either: this is the spelling that means everything under
/// it (`notes/`), for the caller to suggest when nothing matched.
pub fn directory_glob(glob: &str) -> Option<String> {
    let plain = !glob.is_empty() && !glob.ends_with('/') && !glob.contains(['*', '?', '[', '\\']);
    plain.then(|| format!("{glob}/"))
}

/// On stderr, so stdout stays empty for pipes; `nothing` says what came back empty.
fn hint_if_a_directory_was_meant(nothing: &str, workspace: &str, glob: &str) {
    if let Some(dir) = directory_glob(glob) {
        eprintln!(
            "nokv: {nothing} {workspace}:{glob}; if it is a directory, everything under it is {workspace}:{dir}"
        );
    }
}

/// `WS` or `WS:GLOB` (unlike [`Target`], the glob may be left out: every path).
#[derive(Debug, Clone)]
pub struct Scope {
    pub workspace: String,
    pub glob: String,
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Scope, String> {
        let (ws, glob) = s.split_once(':').unwrap_or((s, ""));
        if ws.is_empty() {
            return Err(format!("expected WS or WS:GLOB, got {s:?}"));
        }
        Ok(Scope {
            workspace: ws.to_string(),
            glob: glob.to_string(),
        })
    }
}

pub struct GrepArgs {
    pub regex: String,
    pub scope: Scope,
    pub ignore_case: bool,
    pub context: u32,
    pub max_matches: u32,
    pub include_artifacts: bool,
}

pub async fn grep(client: &Client, out: Output, a: GrepArgs) -> Result<(), ClientError> {
    let (matches, summary) = client
        .grep(pb::GrepRequest {
            workspace: a.scope.workspace.clone(),
            regex: a.regex,
            path_glob: a.scope.glob.clone(),
            max_matches: a.max_matches,
            context_lines: a.context,
            ignore_case: a.ignore_case,
            include_artifacts: a.include_artifacts,
        })
        .await?;
    if !out.json && !summary.truncated_by.is_empty() {
        // On stderr, so stdout stays grep's format for pipes.
        eprintln!(
            "nokv: grep stopped early ({}) after {} in {}",
            summary.truncated_by,
            plural(summary.matches, "match"),
            plural(summary.files_scanned, "file")
        );
    }
    if summary.files_scanned == 0 && !out.json {
        hint_if_a_directory_was_meant("no file was searched at", &a.scope.workspace, &a.scope.glob);
    }
    out.emit(grep_json(&matches, &summary), || {
        grep_lines(&matches, a.context > 0).join("\n")
    });
    Ok(())
}

/// A grep's answer as JSON (the CLI's `--json` and the MCP tool's structured content):
/// `matches` [{path, line_number, line, before, after, generation}] and `summary`.
pub fn grep_json(matches: &[pb::GrepMatch], summary: &pb::GrepSummary) -> Value {
    json!({
        "matches": matches.iter().map(match_json).collect::<Vec<_>>(),
        "summary": {
            "files_scanned": summary.files_scanned,
            "files_skipped": summary.files_skipped,
            "bytes_scanned": summary.bytes_scanned,
            "matches": summary.matches,
            "truncated_by": summary.truncated_by,
        },
    })
}

fn match_json(m: &pb::GrepMatch) -> Value {
    json!({
        "path": m.path,
        "line_number": m.line_number,
        "line": m.line,
        "before": m.before,
        "after": m.after,
        "generation": m.generation,
    })
}

/// grep's output: `path:N:line` for a matching line, `path-N-line` for context, each line
/// once even where contexts overlap (a line that matches prints as a match even when it
/// first shows up as another match's context), and `--` between groups that are not
/// adjacent (with context only).
pub fn grep_lines(matches: &[pb::GrepMatch], context: bool) -> Vec<String> {
    let hits: HashSet<(&str, u64)> = matches
        .iter()
        .map(|m| (m.path.as_str(), m.line_number))
        .collect();
    let mut lines = Vec::new();
    // The last line printed: (path, line number).
    let mut last: Option<(&str, u64)> = None;
    for m in matches {
        let path = m.path.as_str();
        let first = m.line_number - m.before.len() as u64;
        let numbered = m
            .before
            .iter()
            .zip(first..)
            .chain([(&m.line, m.line_number)])
            .chain(m.after.iter().zip(m.line_number + 1..));
        for (text, n) in numbered {
            if last.is_some_and(|(p, ln)| p == path && n <= ln) {
                continue;
            }
            let adjacent = last.is_some_and(|(p, ln)| p == path && n == ln + 1);
            if context && last.is_some() && !adjacent {
                lines.push("--".to_string());
            }
            let sep = if hits.contains(&(path, n)) { ':' } else { '-' };
            lines.push(format!("{path}{sep}{n}{sep}{text}"));
            last = Some((path, n));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: &str, n: u64, line: &str, before: &[&str], after: &[&str]) -> pb::GrepMatch {
        pb::GrepMatch {
            path: path.into(),
            line_number: n,
            line: line.into(),
            before: before.iter().map(|s| s.to_string()).collect(),
            after: after.iter().map(|s| s.to_string()).collect(),
            generation: 1,
        }
    }

    // Catches: context lines printed twice where two matches' contexts overlap, a matching
    // line printed with the context separator, or groups run together without `--`.
    // (Verified red.)
    #[test]
    fn grep_output_prints_each_line_once_with_grep_separators() {
        let matches = [
            m("a", 2, "two", &["one"], &["three"]),
            m("a", 3, "three", &["two"], &["four"]),
            m("a", 9, "nine", &["eight"], &[]),
            m("b", 1, "uno", &[], &["dos"]),
        ];
        assert_eq!(
            grep_lines(&matches, true),
            [
                "a-1-one",
                "a:2:two",
                "a:3:three",
                "a-4-four",
                "--",
                "a-8-eight",
                "a:9:nine",
                "--",
                "b:1:uno",
                "b-2-dos",
            ]
        );
        let plain = [m("a", 2, "two", &[], &[]), m("b", 5, "five", &[], &[])];
        assert_eq!(grep_lines(&plain, false), ["a:2:two", "b:5:five"]);
    }
}
