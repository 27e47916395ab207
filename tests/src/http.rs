//! A minimal HTTP/1.1 client on std alone (metrics and health endpoints, moto's API), so the
//! support code has no moving parts of its own to debug when a test fails.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One HTTP/1.1 request to a plain `http://host:port/path` URL; returns status and body.
/// Panics on any transport error (use in tests where the service must be up).
pub fn http(method: &str, url: &str, body: &[u8]) -> (u16, Vec<u8>) {
    http_with_headers(method, url, &[], body)
}

/// Like [`http`] with extra request headers.
pub fn http_with_headers(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    try_http(method, url, headers, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// Like [`http_with_headers`] but returns transport errors, for readiness probes.
///
/// Sends `Connection: close` and reads to EOF, so no connection reuse or response framing
/// beyond chunked decoding is needed. No `Content-Type` is sent unless given in `headers`
/// (a form type would make some servers parse the body as form fields).
pub fn try_http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let invalid = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidData, msg);
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| invalid(format!("only http:// URLs are supported: {url}")))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = TcpStream::connect(host)?;
    // Bounds a wedged service; no test request should take this long.
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;

    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("response has no header terminator".into()))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut payload = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(format!("bad status line in {head:?}")))?;
    let mut chunked = false;
    let mut content_length = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.eq_ignore_ascii_case("chunked")
            {
                chunked = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                content_length = value.parse::<usize>().ok();
            }
        }
    }
    if chunked {
        payload = decode_chunked(&payload).ok_or_else(|| invalid("bad chunked body".into()))?;
    } else if let Some(len) = content_length {
        payload.truncate(len);
    }
    Ok((status, payload))
}

/// Decodes a complete `Transfer-Encoding: chunked` body (trailers ignored).
fn decode_chunked(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data.windows(2).position(|w| w == b"\r\n")?;
        let size_line = std::str::from_utf8(&data[..eol]).ok()?;
        let size_hex = size_line.split(';').next()?.trim();
        let size = usize::from_str_radix(size_hex, 16).ok()?;
        data = &data[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_body_is_decoded() {
        assert_eq!(
            decode_chunked(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
    }
}
