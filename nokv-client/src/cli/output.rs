//! The CLI's output formatter: human text by default, exactly one JSON document with
//! `--json`. Errors print their typed reason on one line to stderr (and, with `--json`, as a
//! JSON document on stdout too), with the gRPC status code when the reason refines it.

use nokv_client::{ClientError, Reason};
use nokv_proto::v1 as pb;
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub json: bool,
}

impl Output {
    /// Prints a result: `human` when not in JSON mode, else `doc`.
    pub fn emit(&self, doc: Value, human: impl FnOnce() -> String) {
        if self.json {
            println!("{doc}");
        } else {
            let text = human();
            if !text.is_empty() {
                println!("{text}");
            }
        }
    }

    pub fn error(&self, e: &ClientError) {
        // The server's message starts with the reason already; say it once.
        let prefix = format!("{}: ", e.reason_name());
        let msg = e.message.strip_prefix(&prefix).unwrap_or(&e.message);
        let code = grpc_code(e);
        if self.json {
            let mut doc = json!({"error": {"reason": e.reason_name(), "message": msg}});
            if let Some(code) = &code {
                doc["error"]["code"] = json!(code);
            }
            println!("{doc}");
        }
        match code.filter(|c| c != e.reason_name()) {
            Some(code) => eprintln!("nokv: {}: {msg} (gRPC {code})", e.reason_name()),
            None => eprintln!("nokv: {}: {msg}", e.reason_name()),
        }
    }
}

/// The gRPC status code of a server's answer, by its name (`ResourceExhausted`). A server
/// reason refines its code (`QuotaExceeded` and `AdmissionCapReached` are both
/// `ResourceExhausted`), and scripts written against either name must find it.
fn grpc_code(e: &ClientError) -> Option<String> {
    match (&e.reason, e.code) {
        (Reason::Server(_), Some(code)) => Some(format!("{code:?}")),
        _ => None,
    }
}

pub fn kind_name(kind: i32) -> &'static str {
    match pb::EntryKind::try_from(kind) {
        Ok(pb::EntryKind::File) => "file",
        Ok(pb::EntryKind::Artifact) => "artifact",
        _ => "unknown",
    }
}

pub fn entry_json(e: &pb::Entry) -> Value {
    let mut v = json!({
        "workspace": e.workspace,
        "path": e.path,
        "kind": kind_name(e.kind),
        "size": e.size,
        "sha256": hex::encode(&e.sha256),
        "generation": e.generation,
        "modified_ms": e.modified_ms,
    });
    if e.kind == pb::EntryKind::Artifact as i32 {
        v["revision"] = json!(e.revision);
        v["block_count"] = json!(e.block_count);
        v["manifest_sha256"] = json!(hex::encode(&e.manifest_sha256));
    }
    v
}

/// `stat`'s text. The two version numbers are explained where they are shown: `generation`
/// is what a user passes back (`--if-generation`), `revision` only identifies an artifact's
/// stored content.
pub fn entry_human(e: &pb::Entry) -> String {
    let mut s = format!(
        "{}:{}\n  kind        {}\n  size        {} ({})\n  sha256      {}\n  generation  {}  \
         (grows with every change to this path; what --if-generation takes)\n  modified    {}",
        e.workspace,
        e.path,
        kind_name(e.kind),
        e.size,
        human_bytes(e.size),
        hex::encode(&e.sha256),
        e.generation,
        format_ms(e.modified_ms),
    );
    if e.kind == pb::EntryKind::Artifact as i32 {
        s.push_str(&format!(
            "\n  revision    {}  (the stored content this path points at; internal, nothing \
             to pass back)\n  blocks      {}",
            e.revision, e.block_count
        ));
    }
    s
}

/// `1 block`, `2 blocks`: a count with its noun, singular for one.
pub fn plural(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    match (n, noun) {
        (1, _) => format!("1 {noun}"),
        (_, "entry") => format!("{n} entries"),
        (_, "match") => format!("{n} matches"),
        _ => format!("{n} {noun}s"),
    }
}

/// Whether bytes bound for a terminal are text: valid UTF-8 across any number of chunks (a
/// character split between two chunks is carried over). `get` refuses to print anything
/// else to a terminal unless `--force`: binary output can leave the terminal in a state
/// that needs a reset.
#[derive(Debug, Default)]
pub struct TextCheck {
    /// The incomplete character at the end of the last chunk (at most 3 bytes).
    carry: Vec<u8>,
}

impl TextCheck {
    /// Feeds the next chunk; false once the bytes so far cannot be UTF-8.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        let mut joined = std::mem::take(&mut self.carry);
        joined.extend_from_slice(chunk);
        match std::str::from_utf8(&joined) {
            Ok(_) => true,
            // Cut off mid-character: the rest may come with the next chunk.
            Err(e) if e.error_len().is_none() => {
                self.carry = joined[e.valid_up_to()..].to_vec();
                true
            }
            Err(_) => false,
        }
    }

    /// The whole body was fed: false if it ended mid-character.
    pub fn complete(&self) -> bool {
        self.carry.is_empty()
    }
}

/// The refusal of binary bytes to a terminal (a usage error: the command, as typed, would
/// print bytes the terminal cannot show).
pub fn binary_to_terminal(what: &str) -> ClientError {
    ClientError::usage(format!(
        "{what} is not UTF-8 text and stdout is a terminal: not printed; write it to a file \
         (`nokv get {what} FILE`), pipe it, or pass --force to print it anyway"
    ))
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// UTC `YYYY-MM-DD HH:MM:SS` from epoch milliseconds (civil-from-days, no date crate).
pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_sizes_format_for_humans() {
        assert_eq!(format_ms(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_ms(1_798_675_200_000), "2026-12-31 00:00:00 UTC");
        assert_eq!(human_bytes(4096), "4.0 KiB");
        assert_eq!(human_bytes(12), "12 B");
    }

    #[test]
    fn text_for_a_terminal_is_utf8_even_when_a_character_is_split_between_chunks() {
        let text = "grüße, 世界\n".as_bytes();
        let mut whole = TextCheck::default();
        assert!(whole.feed(text) && whole.complete());
        for cut in 0..text.len() {
            let mut split = TextCheck::default();
            assert!(split.feed(&text[..cut]), "cut at {cut}");
            assert!(split.feed(&text[cut..]) && split.complete(), "cut at {cut}");
        }
        let mut binary = TextCheck::default();
        assert!(!binary.feed(&[0x7f, b'E', b'L', b'F', 2, 1, 0xff, 0]));
        let mut truncated = TextCheck::default();
        assert!(truncated.feed(&"ü".as_bytes()[..1]) && !truncated.complete());
        assert!(TextCheck::default().complete(), "empty is text");
    }

    #[test]
    fn one_of_a_thing_is_singular_and_every_other_count_plural() {
        assert_eq!(plural(1u32, "block"), "1 block");
        assert_eq!(plural(0u32, "block"), "0 blocks");
        assert_eq!(plural(2u64, "block"), "2 blocks");
        assert_eq!(plural(1u64, "entry"), "1 entry");
        assert_eq!(plural(3u64, "entry"), "3 entries");
        assert_eq!(plural(2u64, "match"), "2 matches");
    }
}
