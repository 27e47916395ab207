//! Smoke tests of the external services the black-box tests rely on: if these fail, the
//! environment (scripts/test.sh's installs) is broken, not nokv.

use nokv_tests::{Etcd, Moto, http};

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (what etcd's JSON gateway uses for bytes fields).
fn b64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = B64.iter().position(|&x| x == c).expect("base64 character") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[test]
fn base64_helpers_round_trip() {
    assert_eq!(b64_encode(b"nokv"), "bm9rdg==");
    for len in 0..8 {
        let data: Vec<u8> = (0..len).map(|i| (i * 37 + 200) as u8).collect();
        assert_eq!(b64_decode(&b64_encode(&data)), data);
    }
}

#[test]
fn etcd_starts_on_loopback_and_reports_healthy() {
    let etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    assert!(endpoint.starts_with("http://127.0.0.1:"), "{endpoint}");

    let (status, body) = http("GET", &format!("{endpoint}/health"), b"");
    assert_eq!(status, 200);
    let health: serde_json::Value = serde_json::from_slice(&body).expect("health JSON");
    assert_eq!(health["health"], "true");

    let key = b64_encode(b"nokv/smoke");
    let value = b64_encode(b"hello from the smoke test");
    let put = serde_json::json!({ "key": key, "value": value }).to_string();
    let (status, body) = http("POST", &format!("{endpoint}/v3/kv/put"), put.as_bytes());
    assert_eq!(status, 200, "put: {}", String::from_utf8_lossy(&body));

    let range = serde_json::json!({ "key": key }).to_string();
    let (status, body) = http("POST", &format!("{endpoint}/v3/kv/range"), range.as_bytes());
    assert_eq!(status, 200, "range: {}", String::from_utf8_lossy(&body));
    let reply: serde_json::Value = serde_json::from_slice(&body).expect("range JSON");
    let got = reply["kvs"][0]["value"]
        .as_str()
        .expect("one kv in range reply");
    assert_eq!(b64_decode(got), b"hello from the smoke test");
}

#[test]
fn moto_starts_on_loopback_and_stores_an_object() {
    let moto = Moto::start();
    moto.create_bucket("smoke");
    // Every byte value, so nothing in the HTTP path may treat the body as text.
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let path = "/smoke/dir/object.bin";

    let (status, body) = moto.s3("PUT", path, &data);
    assert_eq!(status, 200, "put: {}", String::from_utf8_lossy(&body));
    let (status, body) = moto.s3("GET", path, b"");
    assert_eq!(status, 200);
    assert!(
        body == data,
        "GET returned {} bytes, not the {} stored",
        body.len(),
        data.len()
    );
    let (status, _) = moto.s3("DELETE", path, b"");
    assert_eq!(status, 204);
    let (status, _) = moto.s3("GET", path, b"");
    assert_eq!(status, 404, "object still readable after DELETE");
}
