//! Decryption against RFC 8448's TLS 1.3 trace (its secrets and records) and against
//! sessions rustls makes in memory with its key log (TLS 1.2 ECDHE AES-GCM and ChaCha20,
//! TLS 1.3 with a KeyUpdate and a HelloRetryRequest): an independent implementation's bytes.

use std::sync::{Arc, Mutex};

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// RFC 8448 section 3, "Simple 1-RTT Handshake".
const CH: &str = "01 00 00 c0 03 03 cb 34 ec b1 e7 81 63 ba 1c 38 c6 da cb 19 6a 6d ff a2
    1a 8d 99 12 ec 18 a2 ef 62 83 02 4d ec e7 00 00 06 13 01 13 03 13 02 01
    00 00 91 00 00 00 0b 00 09 00 00 06 73 65 72 76 65 72 ff 01 00 01 00 00
    0a 00 14 00 12 00 1d 00 17 00 18 00 19 01 00 01 01 01 02 01 03 01 04 00
    23 00 00 00 33 00 26 00 24 00 1d 00 20 99 38 1d e5 60 e4 bd 43 d2 3d 8e
    43 5a 7d ba fe b3 c0 6e 51 c1 3c ae 4d 54 13 69 1e 52 9a af 2c 00 2b 00
    03 02 03 04 00 0d 00 20 00 1e 04 03 05 03 06 03 02 03 08 04 08 05 08 06
    04 01 05 01 06 01 02 01 04 02 05 02 06 02 02 02 00 2d 00 02 01 01 00 1c
    00 02 40 01";
const SH_REC: &str = "16 03 03 00 5a 02 00 00 56 03 03 a6 af 06 a4 12 18 60 dc 5e 6e 60 24 9c
    d3 4c 95 93 0c 8a c5 cb 14 34 da c1 55 77 2e d3 e2 69 28 00 13 01 00 00
    2e 00 33 00 24 00 1d 00 20 c9 82 88 76 11 20 95 fe 66 76 2b db f7 c6 72
    e1 56 d6 cc 25 3b 83 3d f1 dd 69 b1 b0 4e 75 1f 0f 00 2b 00 02 03 04";
const FLIGHT_REC: &str = "17 03 03 02 a2 d1 ff 33 4a 56 f5 bf f6 59 4a 07 cc 87 b5 80 23 3f 50 0f
    45 e4 89 e7 f3 3a f3 5e df 78 69 fc f4 0a a4 0a a2 b8 ea 73 f8 48 a7 ca
    07 61 2e f9 f9 45 cb 96 0b 40 68 90 51 23 ea 78 b1 11 b4 29 ba 91 91 cd
    05 d2 a3 89 28 0f 52 61 34 aa dc 7f c7 8c 4b 72 9d f8 28 b5 ec f7 b1 3b
    d9 ae fb 0e 57 f2 71 58 5b 8e a9 bb 35 5c 7c 79 02 07 16 cf b9 b1 18 3e
    f3 ab 20 e3 7d 57 a6 b9 d7 47 76 09 ae e6 e1 22 a4 cf 51 42 73 25 25 0c
    7d 0e 50 92 89 44 4c 9b 3a 64 8f 1d 71 03 5d 2e d6 5b 0e 3c dd 0c ba e8
    bf 2d 0b 22 78 12 cb b3 60 98 72 55 cc 74 41 10 c4 53 ba a4 fc d6 10 92
    8d 80 98 10 e4 b7 ed 1a 8f d9 91 f0 6a a6 24 82 04 79 7e 36 a6 a7 3b 70
    a2 55 9c 09 ea d6 86 94 5b a2 46 ab 66 e5 ed d8 04 4b 4c 6d e3 fc f2 a8
    94 41 ac 66 27 2f d8 fb 33 0e f8 19 05 79 b3 68 45 96 c9 60 bd 59 6e ea
    52 0a 56 a8 d6 50 f5 63 aa d2 74 09 96 0d ca 63 d3 e6 88 61 1e a5 e2 2f
    44 15 cf 95 38 d5 1a 20 0c 27 03 42 72 96 8a 26 4e d6 54 0c 84 83 8d 89
    f7 2c 24 46 1a ad 6d 26 f5 9e ca ba 9a cb bb 31 7b 66 d9 02 f4 f2 92 a3
    6a c1 b6 39 c6 37 ce 34 31 17 b6 59 62 22 45 31 7b 49 ee da 0c 62 58 f1
    00 d7 d9 61 ff b1 38 64 7e 92 ea 33 0f ae ea 6d fa 31 c7 a8 4d c3 bd 7e
    1b 7a 6c 71 78 af 36 87 90 18 e3 f2 52 10 7f 24 3d 24 3d c7 33 9d 56 84
    c8 b0 37 8b f3 02 44 da 8c 87 c8 43 f5 e5 6e b4 c5 e8 28 0a 2b 48 05 2c
    f9 3b 16 49 9a 66 db 7c ca 71 e4 59 94 26 f7 d4 61 e6 6f 99 88 2b d8 9f
    c5 08 00 be cc a6 2d 6c 74 11 6d bd 29 72 fd a1 fa 80 f8 5d f8 81 ed be
    5a 37 66 89 36 b3 35 58 3b 59 91 86 dc 5c 69 18 a3 96 fa 48 a1 81 d6 b6
    fa 4f 9d 62 d5 13 af bb 99 2f 2b 99 2f 67 f8 af e6 7f 76 91 3f a3 88 cb
    56 30 c8 ca 01 e0 c6 5d 11 c6 6a 1e 2a c4 c8 59 77 b7 c7 a6 99 9b bf 10
    dc 35 ae 69 f5 51 56 14 63 6c 0b 9b 68 c1 9e d2 e3 1c 0b 3b 66 76 30 38
    eb ba 42 f3 b3 8e dc 03 99 f3 a9 f2 3f aa 63 97 8c 31 7f c9 fa 66 a7 3f
    60 f0 50 4d e9 3b 5b 84 5e 27 55 92 c1 23 35 ee 34 0b bc 4f dd d5 02 78
    40 16 e4 b3 be 7e f0 4d da 49 f4 b4 40 a3 0c b5 d2 af 93 98 28 fd 4a e3
    79 4e 44 f9 4d f5 a6 31 ed e4 2c 17 19 bf da bf 02 53 fe 51 75 be 89 8e
    75 0e dc 53 37 0d 2b";
const CFIN_REC: &str = "17 03 03 00 35 75 ec 4d c2 38 cc e6 0b 29 80 44 a7 1e 21 9c 56 cc 77 b0
    51 7f e9 b9 3c 7a 4b fc 44 d8 7f 38 f8 03 38 ac 98 fc 46 de b3 84 bd 1c
    ae ac ab 68 67 d7 26 c4 05 46";
const NST_REC: &str = "17 03 03 00 de 3a 6b 8f 90 41 4a 97 d6 95 9c 34 87 68 0d e5 13 4a 2b 24
    0e 6c ff ac 11 6e 95 d4 1d 6a f8 f6 b5 80 dc f3 d1 1d 63 c7 58 db 28 9a
    01 59 40 25 2f 55 71 3e 06 1d c1 3e 07 88 91 a3 8e fb cf 57 53 ad 8e f1
    70 ad 3c 73 53 d1 6d 9d a7 73 b9 ca 7f 2b 9f a1 b6 c0 d4 a3 d0 3f 75 e0
    9c 30 ba 1e 62 97 2a c4 6f 75 f7 b9 81 be 63 43 9b 29 99 ce 13 06 46 15
    13 98 91 d5 e4 c5 b4 06 f1 6e 3f c1 81 a7 7c a4 75 84 00 25 db 2f 0a 77
    f8 1b 5a b0 5b 94 c0 13 46 75 5f 69 23 2c 86 51 9d 86 cb ee ac 87 aa c3
    47 d1 43 f9 60 5d 64 f6 50 db 4d 02 3e 70 e9 52 ca 49 fe 51 37 12 1c 74
    bc 26 97 68 7e 24 87 46 d6 df 35 30 05 f3 bc e1 86 96 12 9c 81 53 55 6b
    3b 6c 67 79 b3 7b f1 59 85 68 4f";
const C_APP_REC: &str = "17 03 03 00 43 a2 3f 70 54 b6 2c 94 d0 af fa fe 82 28 ba 55 cb ef ac ea
    42 f9 14 aa 66 bc ab 3f 2b 98 19 a8 a5 b4 6b 39 5b d5 4a 9a 20 44 1e 2b
    62 97 4e 1f 5a 62 92 a2 97 70 14 bd 1e 3d ea e6 3a ee bb 21 69 49 15 e4";
const S_APP_REC: &str = "17 03 03 00 43 2e 93 7e 11 ef 4a c7 40 e5 38 ad 36 00 5f c4 a4 69 32 fc
    32 25 d0 5f 82 aa 1b 36 e3 0e fa f9 7d 90 e6 df fc 60 2d cb 50 1a 59 a8
    fc c4 9c 4b f2 e5 f0 a2 1c 00 47 c2 ab f3 32 54 0d d0 32 e1 67 c2 95 5d";
const C_ALERT_REC: &str = "17 03 03 00 13 c9 87 27 60 65 56 66 b7 4d 7f f1 15 3e fd 6d b6 d0 b0 e3";
const S_ALERT_REC: &str = "17 03 03 00 13 b5 8f d6 71 66 eb f5 99 d2 47 20 cf be 7e fa 7a 88 64 a9";
const RANDOM: &str = "cb34ecb1e78163ba1c38c6dacb196a6dffa21a8d9912ec18a2ef6283024dece7";
const C_HS: &str = "b3eddb126e067f35a780b3abf45e2d8f3b1a950738f52e9600746a0e27a55a21";
const S_HS: &str = "b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38";
const C_AP: &str = "9e40646ce79a7f9dc05af8889bce6552875afa0b06df0087f792ebb7c17504a5";
const S_AP: &str = "a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643";

fn rfc8448_keylog(labels: &[&str]) -> KeyLog {
    let mut k = KeyLog::new();
    let all = [
        ("CLIENT_HANDSHAKE_TRAFFIC_SECRET", C_HS),
        ("SERVER_HANDSHAKE_TRAFFIC_SECRET", S_HS),
        ("CLIENT_TRAFFIC_SECRET_0", C_AP),
        ("SERVER_TRAFFIC_SECRET_0", S_AP),
    ];
    for (l, s) in all {
        if labels.contains(&l) {
            k.feed(format!("{l} {RANDOM} {s}\n").as_bytes(), false);
        }
    }
    k
}

/// The trace as each side sent it, in capture order.
fn rfc8448_flow() -> Vec<(Side, Vec<u8>)> {
    let ch = hex(CH);
    let mut ch_rec = vec![0x16, 3, 1, 0, ch.len() as u8];
    ch_rec.extend_from_slice(&ch);
    let mut server = hex(SH_REC);
    server.extend(hex(FLIGHT_REC));
    vec![
        (Side::Client, ch_rec),
        (Side::Server, server),
        (Side::Client, hex(CFIN_REC)),
        (Side::Server, hex(NST_REC)),
        (Side::Client, hex(C_APP_REC)),
        (Side::Server, hex(S_APP_REC)),
        (Side::Client, hex(C_ALERT_REC)),
        (Side::Server, hex(S_ALERT_REC)),
    ]
}

type Plain = Vec<(Side, Vec<u8>)>;

/// Feeds `flow` in pieces of `chunk` bytes; the plaintext out and the last result.
fn run(flow: &[(Side, Vec<u8>)], keys: &KeyLog, chunk: usize) -> (Plain, Result<Status, Stop>) {
    let mut conn = Conn::new();
    let mut out: Plain = Vec::new();
    let mut last = Ok(Status::Running);
    for (side, bytes) in flow {
        for piece in bytes.chunks(chunk) {
            last = conn.push(*side, piece, keys, &mut |s, p| match out.last_mut() {
                Some((ls, v)) if *ls == s => v.extend_from_slice(p),
                _ => out.push((s, p.to_vec())),
            });
            if last.is_err() {
                return (out, last);
            }
        }
    }
    (out, last)
}

#[test]
fn rfc8448_trace_decrypts_to_its_application_data() {
    let keys = rfc8448_keylog(&[
        "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
        "SERVER_HANDSHAKE_TRAFFIC_SECRET",
        "CLIENT_TRAFFIC_SECRET_0",
        "SERVER_TRAFFIC_SECRET_0",
    ]);
    let payload: Vec<u8> = (0..50).collect();
    let want = vec![(Side::Client, payload.clone()), (Side::Server, payload)];
    for chunk in [1, 7, 100, 10_000] {
        let (out, last) = run(&rfc8448_flow(), &keys, chunk);
        assert_eq!(last, Ok(Status::Running), "chunk {chunk}");
        assert_eq!(out, want, "chunk {chunk}");
    }
}

#[test]
fn a_missing_secret_waits_and_nothing_is_lost_when_it_comes() {
    let mut keys = rfc8448_keylog(&[
        "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
        "SERVER_HANDSHAKE_TRAFFIC_SECRET",
    ]);
    let mut conn = Conn::new();
    let mut out = Vec::new();
    let mut status = Ok(Status::Running);
    for (side, bytes) in rfc8448_flow() {
        status = conn.push(side, &bytes, &keys, &mut |_, p| out.extend_from_slice(p));
    }
    assert_eq!(status, Ok(Status::NeedSecret));
    assert!(out.is_empty());
    assert!(conn.authenticated(), "the handshake keys worked");
    keys.feed(
        format!(
            "CLIENT_TRAFFIC_SECRET_0 {RANDOM} {C_AP}\nSERVER_TRAFFIC_SECRET_0 {RANDOM} {S_AP}\n"
        )
        .as_bytes(),
        false,
    );
    let status = conn.push(Side::Client, &[], &keys, &mut |_, p| {
        out.extend_from_slice(p);
    });
    assert_eq!(status, Ok(Status::Running));
    assert_eq!(out.len(), 100);
}

#[test]
fn a_wrong_secret_fails_authentication_and_a_changed_byte_too() {
    let mut keys = rfc8448_keylog(&[
        "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
        "CLIENT_TRAFFIC_SECRET_0",
        "SERVER_TRAFFIC_SECRET_0",
    ]);
    keys.feed(
        format!("SERVER_HANDSHAKE_TRAFFIC_SECRET {RANDOM} {C_HS}\n").as_bytes(),
        false,
    );
    let (_, last) = run(&rfc8448_flow(), &keys, 10_000);
    assert_eq!(last, Err(Stop::Failed("bad_record_mac")));
    let keys = rfc8448_keylog(&[
        "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
        "SERVER_HANDSHAKE_TRAFFIC_SECRET",
        "CLIENT_TRAFFIC_SECRET_0",
        "SERVER_TRAFFIC_SECRET_0",
    ]);
    let mut flow = rfc8448_flow();
    let rec = &mut flow[4].1;
    rec[20] ^= 1;
    let (out, last) = run(&flow, &keys, 10_000);
    assert_eq!(last, Err(Stop::Failed("bad_record_mac")));
    assert!(out.is_empty());
}

#[test]
fn not_tls_and_unsupported_suites_are_named() {
    let keys = KeyLog::new();
    let http = vec![(Side::Client, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())];
    assert_eq!(run(&http, &keys, 100).1, Err(Stop::NotTls));
    let mut flow = rfc8448_flow();
    // The ServerHello's suite becomes TLS_AES_128_CCM_SHA256.
    let sh = &mut flow[1].1;
    let at = 5 + 4 + 2 + 32 + 1;
    assert_eq!(&sh[at..at + 2], &[0x13, 0x01]);
    sh[at + 1] = 0x04;
    assert_eq!(
        run(&flow, &keys, 100).1,
        Err(Stop::Unsupported("TLS_AES_128_CCM_SHA256".into()))
    );
    // A record longer than the protocol allows is refused before anything is kept.
    let long = vec![(Side::Client, vec![0x16, 3, 1, 0xff, 0xff])];
    assert_eq!(run(&long, &keys, 100).1, Err(Stop::NotTls));
}

// Sessions made by rustls in memory, with its key log.

#[derive(Debug, Default)]
struct Log(Mutex<String>);

impl rustls::KeyLog for Log {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        let h = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let line = format!("{label} {} {}\n", h(client_random), h(secret));
        self.0.lock().unwrap().push_str(&line);
    }
}

struct Made {
    flow: Vec<(Side, Vec<u8>)>,
    log: String,
    requests: Vec<u8>,
    answers: Vec<u8>,
}

/// A session between rustls' client and server: `suite` only, the client's key share in a
/// group the server lacks when `retry`, two requests and answers, a KeyUpdate from both
/// sides between them when `update`.
fn rustls_session(suite: rustls::SupportedCipherSuite, retry: bool, update: bool) -> Made {
    use rustls::crypto::ring as provider;
    use std::io::{Read, Write};
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["lab.test".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let version = suite.version();
    let mut sp = provider::default_provider();
    sp.cipher_suites = vec![suite];
    if retry {
        sp.kx_groups = vec![provider::kx_group::SECP256R1];
    }
    let server_cfg = rustls::ServerConfig::builder_with_provider(Arc::new(sp))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let mut cp = provider::default_provider();
    cp.cipher_suites = vec![suite];
    cp.kx_groups = vec![provider::kx_group::X25519, provider::kx_group::SECP256R1];
    let mut client_cfg = rustls::ClientConfig::builder_with_provider(Arc::new(cp))
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let log = Arc::new(Log::default());
    client_cfg.key_log = log.clone();
    let mut client =
        rustls::ClientConnection::new(Arc::new(client_cfg), "lab.test".try_into().unwrap())
            .unwrap();
    let mut server = rustls::ServerConnection::new(Arc::new(server_cfg)).unwrap();
    let mut flow: Vec<(Side, Vec<u8>)> = Vec::new();
    let mut answers = Vec::new();
    let mut requests = Vec::new();
    let shuttle = |client: &mut rustls::ClientConnection,
                   server: &mut rustls::ServerConnection,
                   flow: &mut Vec<(Side, Vec<u8>)>| {
        for _ in 0..10 {
            let mut c = Vec::new();
            while client.wants_write() {
                client.write_tls(&mut c).unwrap();
            }
            if !c.is_empty() {
                server.read_tls(&mut &c[..]).unwrap();
                server.process_new_packets().unwrap();
                flow.push((Side::Client, c));
            }
            let mut s = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut s).unwrap();
            }
            if !s.is_empty() {
                client.read_tls(&mut &s[..]).unwrap();
                client.process_new_packets().unwrap();
                flow.push((Side::Server, s));
            }
        }
    };
    for i in 0..2 {
        let req = format!("GET /{i} HTTP/1.1\r\nHost: lab.test\r\n\r\n");
        client.writer().write_all(req.as_bytes()).unwrap();
        requests.extend_from_slice(req.as_bytes());
        shuttle(&mut client, &mut server, &mut flow);
        let mut got = vec![0u8; req.len()];
        server.reader().read_exact(&mut got).unwrap();
        let ans = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {i}\r\n\r\n{}",
            "x".repeat(i)
        );
        server.writer().write_all(ans.as_bytes()).unwrap();
        answers.extend_from_slice(ans.as_bytes());
        shuttle(&mut client, &mut server, &mut flow);
        let mut got = vec![0u8; ans.len()];
        client.reader().read_exact(&mut got).unwrap();
        if update && i == 0 {
            client.refresh_traffic_keys().unwrap();
            server.refresh_traffic_keys().unwrap();
        }
    }
    let log = log.0.lock().unwrap().clone();
    Made {
        flow,
        log,
        requests,
        answers,
    }
}

fn decrypt_made(m: &Made, chunk: usize) -> (Vec<u8>, Vec<u8>, Result<Status, Stop>) {
    let mut keys = KeyLog::new();
    keys.feed(m.log.as_bytes(), true);
    let (out, last) = run(&m.flow, &keys, chunk);
    let mut c = Vec::new();
    let mut s = Vec::new();
    for (side, p) in out {
        match side {
            Side::Client => c.extend(p),
            Side::Server => s.extend(p),
        }
    }
    (c, s, last)
}

#[test]
fn rustls_sessions_of_every_handled_suite_decrypt() {
    use rustls::crypto::ring::cipher_suite as cs;
    for (suite, retry, update) in [
        (cs::TLS13_AES_128_GCM_SHA256, false, true),
        (cs::TLS13_AES_256_GCM_SHA384, true, true),
        (cs::TLS13_CHACHA20_POLY1305_SHA256, false, false),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, false, false),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, false, false),
        (
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            false,
            false,
        ),
    ] {
        let made = rustls_session(suite, retry, update);
        for chunk in [3, 1 << 20] {
            let (c, s, last) = decrypt_made(&made, chunk);
            let name = suite.suite();
            assert_eq!(last, Ok(Status::Running), "{name:?}");
            assert_eq!(c, made.requests, "{name:?} chunk {chunk}");
            assert_eq!(s, made.answers, "{name:?} chunk {chunk}");
        }
    }
}

fn rfc8448_log() -> String {
    [
        ("CLIENT_HANDSHAKE_TRAFFIC_SECRET", C_HS),
        ("SERVER_HANDSHAKE_TRAFFIC_SECRET", S_HS),
        ("CLIENT_TRAFFIC_SECRET_0", C_AP),
        ("SERVER_TRAFFIC_SECRET_0", S_AP),
    ]
    .iter()
    .map(|(l, s)| format!("{l} {RANDOM} {s}\n"))
    .collect()
}

#[test]
fn fuzz_body_survives_the_rfc_trace_cut_anywhere() {
    let data = fuzz_input(&rfc8448_log(), &rfc8448_flow());
    assert_eq!(fuzz_decrypt(&data), 100);
    for cut in (0..data.len()).step_by(37) {
        fuzz_decrypt(&data[..cut]);
        let mut flipped = data.clone();
        flipped[cut] ^= 0x55;
        fuzz_decrypt(&flipped);
    }
}

/// The hand-made seeds: RFC 8448's trace and rustls sessions of TLS 1.2 and 1.3, each with
/// its key log, so the fuzzer starts from inputs that decrypt.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use rustls::crypto::ring::cipher_suite as cs;
    let made = |suite, retry, update| {
        let m = rustls_session(suite, retry, update);
        fuzz_input(&m.log, &m.flow)
    };
    vec![
        ("rfc8448", fuzz_input(&rfc8448_log(), &rfc8448_flow())),
        (
            "tls13_hrr_keyupdate",
            made(cs::TLS13_AES_256_GCM_SHA384, true, true),
        ),
        (
            "tls12_gcm",
            made(cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, false, false),
        ),
        (
            "tls12_chacha",
            made(
                cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                false,
                false,
            ),
        ),
    ]
}

/// Writes the hand-made seeds again (`--ignored`), after a change of the input layout.
#[test]
#[ignore = "writes fuzz/corpus/tls_decrypt"]
fn write_seed_corpus() {
    for (name, bytes) in seeds() {
        tcpkit_lab::corpus::write("tls_decrypt", name, &bytes);
    }
}

/// Every seed of the corpus runs through the fuzz body, and the hand-made ones decrypt.
#[test]
fn the_seed_corpus_decrypts() {
    let corpus = tcpkit_lab::corpus::seeds("tls_decrypt");
    for s in &corpus {
        let n = fuzz_decrypt(&s.bytes);
        if !s.grown() {
            assert!(n > 0, "seed {} decrypted nothing", s.name);
        }
    }
    assert!(corpus.len() >= seeds().len());
}
