//! DNS-over-TCP messages (RFC 1035 §4, RFC 7766): what `tcpkit load --dns` sends and checks, and
//! what `tcpkit echo --dns` answers.
//!
//! Only the part of DNS a load generator and a reference server need: one question per query,
//! class IN, A/AAAA answers. Untrusted bytes (answers from a server under test, queries from any
//! client) enter only through [`parse_response`], [`parse_query`] and [`tcp_message_len`], which
//! check every offset, follow compression pointers only backwards and at most [`MAX_HOPS`] times,
//! and report what was wrong at which byte offset. They never panic and never loop (the `dns`
//! fuzz target and the corpus test below hold us to that). Builders append to a caller's `Vec`,
//! so a connection reuses one buffer for every query it sends.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Resource record types by their mnemonic (RFC 1035, 3596, 2782).
pub const TYPE_A: u16 = 1;
/// NS: an authoritative name server (RFC 1035).
pub const TYPE_NS: u16 = 2;
/// CNAME: the canonical name of an alias (RFC 1035).
pub const TYPE_CNAME: u16 = 5;
/// SOA: start of a zone of authority (RFC 1035).
pub const TYPE_SOA: u16 = 6;
/// PTR: a domain name pointer, as in reverse lookups (RFC 1035).
pub const TYPE_PTR: u16 = 12;
/// MX: mail exchange (RFC 1035).
pub const TYPE_MX: u16 = 15;
/// TXT: text strings (RFC 1035).
pub const TYPE_TXT: u16 = 16;
/// AAAA: an IPv6 address (RFC 3596).
pub const TYPE_AAAA: u16 = 28;
/// SRV: the location of a service (RFC 2782).
pub const TYPE_SRV: u16 = 33;
/// ANY (`*`): a QTYPE only, asking for all records (RFC 1035 §3.2.3; RFC 8482 lets servers
/// answer with less).
pub const TYPE_ANY: u16 = 255;
/// Class IN, the only class tcpkit asks for.
pub const CLASS_IN: u16 = 1;
/// Size of the fixed DNS header.
pub const HEADER_LEN: usize = 12;
/// Compression pointers followed per name before the name is declared a loop. A legal name has
/// at most 127 labels, but real servers point once or twice; 32 bounds the work per name.
pub const MAX_HOPS: usize = 32;
/// Longest name in wire form (RFC 1035 §2.3.4), root label included.
pub const MAX_NAME_LEN: usize = 255;
/// Longest label (RFC 1035 §2.3.4).
pub const MAX_LABEL_LEN: usize = 63;
/// TTL of the answers [`write_tcp_response`] builds.
pub const ANSWER_TTL: u32 = 60;

const QR: u16 = 0x8000;
const OPCODE_MASK: u16 = 0x7800;
const TC: u16 = 0x0200;
const RD: u16 = 0x0100;
const RA: u16 = 0x0080;
const RCODE_MASK: u16 = 0x000f;

/// Why a DNS message or a name/type given on the command line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// The message ends inside `what`. Fields are `&'static str` so the error path of a
    /// per-answer parse allocates nothing.
    #[error("DNS {what} truncated at offset {offset}: need {need} bytes, have {have}")]
    Truncated {
        /// The part that is cut: `header`, `question`, `answer`, `name`, ...
        what: &'static str,
        /// Offset in the message of the part (or of its field) that is cut.
        offset: usize,
        /// Bytes it needs from `offset`.
        need: usize,
        /// Bytes left from `offset`.
        have: usize,
    },
    /// `what`, starting at byte `offset` of the message, breaks a rule of the protocol.
    #[error("DNS {what} at offset {offset}: {why}")]
    Malformed {
        /// The part that is wrong.
        what: &'static str,
        /// Byte of the message where it starts.
        offset: usize,
        /// The rule it breaks.
        why: &'static str,
    },
    /// A domain name given as text is not valid.
    #[error("invalid domain name {text:?}: {why}")]
    Name {
        /// The name as given.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// A query type given as text is neither a known mnemonic nor a number 0-65535.
    #[error("invalid query type {text:?}: give A, AAAA, NS, CNAME, SOA, PTR, MX, TXT, SRV, ANY or a number 0-65535")]
    Qtype {
        /// The type as given.
        text: String,
    },
}

fn truncated(what: &'static str, offset: usize, need: usize, have: usize) -> DnsError {
    DnsError::Truncated {
        what,
        offset,
        need,
        have,
    }
}

fn malformed(what: &'static str, offset: usize, why: &'static str) -> DnsError {
    DnsError::Malformed { what, offset, why }
}

/// A validated domain name, kept in wire form (length-prefixed labels ending with the root
/// label), so writing a query is one copy.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Name {
    wire: Vec<u8>,
}

impl Name {
    /// The name in wire form, root label included.
    pub fn as_wire(&self) -> &[u8] {
        &self.wire
    }

    /// The root name `.`.
    pub fn root() -> Name {
        Name { wire: vec![0] }
    }
}

impl FromStr for Name {
    type Err = DnsError;

    /// `example.com` or `example.com.`; `.` is the root. Labels are 1-63 printable ASCII
    /// characters other than `.` (no escapes), the whole name at most 255 bytes in wire form.
    fn from_str(text: &str) -> Result<Name, DnsError> {
        let err = |why: String| DnsError::Name {
            text: text.to_owned(),
            why,
        };
        if text.is_empty() {
            return Err(err("empty (the root is \".\")".into()));
        }
        if text == "." {
            return Ok(Name::root());
        }
        let body = text.strip_suffix('.').unwrap_or(text);
        let mut wire = Vec::with_capacity(body.len() + 2);
        for (i, label) in body.split('.').enumerate() {
            if label.is_empty() {
                return Err(err(format!("label {} is empty", i + 1)));
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(err(format!(
                    "label {} is {} bytes, at most {MAX_LABEL_LEN} allowed",
                    i + 1,
                    label.len()
                )));
            }
            if let Some(c) = label.chars().find(|c| !c.is_ascii_graphic()) {
                return Err(err(format!(
                    "label {} has {c:?}: only printable ASCII without spaces",
                    i + 1
                )));
            }
            wire.push(label.len() as u8);
            wire.extend_from_slice(label.as_bytes());
        }
        wire.push(0);
        if wire.len() > MAX_NAME_LEN {
            return Err(err(format!(
                "{} bytes in wire form, at most {MAX_NAME_LEN} allowed",
                wire.len()
            )));
        }
        Ok(Name { wire })
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wire.len() <= 1 {
            return f.write_str(".");
        }
        let mut rest = self.wire.as_slice();
        let mut first = true;
        // The wire form was built by `from_str`, so the labels are well formed; `get` keeps this
        // panic-free all the same.
        while let [len, tail @ ..] = rest {
            let n = usize::from(*len);
            let Some(label) = tail.get(..n) else { break };
            if n == 0 {
                break;
            }
            if !first {
                f.write_str(".")?;
            }
            first = false;
            f.write_str(&String::from_utf8_lossy(label))?;
            rest = &tail[n..];
        }
        Ok(())
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Name({self})")
    }
}

/// A query type by mnemonic (`A`, `aaaa`, ..., case-insensitive), as `TYPEnn` (RFC 3597) or as
/// a number.
pub fn qtype_from_str(s: &str) -> Result<u16, DnsError> {
    let known = [
        ("A", TYPE_A),
        ("NS", TYPE_NS),
        ("CNAME", TYPE_CNAME),
        ("SOA", TYPE_SOA),
        ("PTR", TYPE_PTR),
        ("MX", TYPE_MX),
        ("TXT", TYPE_TXT),
        ("AAAA", TYPE_AAAA),
        ("SRV", TYPE_SRV),
        ("ANY", TYPE_ANY),
    ];
    if let Some((_, t)) = known.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
        return Ok(*t);
    }
    let digits = match s.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("TYPE") => &s[4..],
        _ => s,
    };
    digits
        .parse::<u16>()
        .map_err(|_| DnsError::Qtype { text: s.to_owned() })
}

/// The mnemonic of a response code, for summaries (`NOERROR`, `SERVFAIL`, ...).
pub fn rcode_name(rcode: u8) -> &'static str {
    match rcode {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        6 => "YXDOMAIN",
        7 => "YXRRSET",
        8 => "NXRRSET",
        9 => "NOTAUTH",
        10 => "NOTZONE",
        _ => "RCODE?",
    }
}

/// Appends one DNS-over-TCP query (2-byte length prefix + 12-byte header with RD set + one
/// question, class IN).
pub fn write_tcp_query(out: &mut Vec<u8>, id: u16, qname: &Name, qtype: u16) {
    // A name is at most 255 bytes, so the message (≤ 271 bytes) always fits the 16-bit prefix.
    let len = HEADER_LEN + qname.wire.len() + 4;
    out.reserve(2 + len);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&RD.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // QD=1, AN=NS=AR=0
    out.extend_from_slice(&qname.wire);
    out.extend_from_slice(&qtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
}

/// Length of the first complete length-prefixed message at the front of `buf` (prefix
/// included), None if incomplete.
pub fn tcp_message_len(buf: &[u8]) -> Option<usize> {
    let [hi, lo, rest @ ..] = buf else {
        return None;
    };
    let len = usize::from(u16::from_be_bytes([*hi, *lo]));
    (rest.len() >= len).then_some(2 + len)
}

/// What a load generator needs from an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseView {
    /// ID from the header, to match the answer to its query.
    pub id: u16,
    /// RCODE, the header's 4 bits (0 NOERROR, 2 SERVFAIL, 3 NXDOMAIN, ...).
    pub rcode: u8,
    /// TC: the answer was cut to fit (over UDP: ask again over TCP).
    pub truncated: bool,
    /// ANCOUNT: answer records in the message.
    pub answers: u16,
}

/// What a server needs from a query: its id, its type, and where its question ends (the
/// question is `msg[12..question_end]`, copied into the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryView {
    /// ID from the header, copied into the answer.
    pub id: u16,
    /// QTYPE of the (first) question.
    pub qtype: u16,
    /// Offset just past the question (QNAME, QTYPE, QCLASS).
    pub question_end: usize,
}

struct Header {
    id: u16,
    flags: u16,
    qdcount: u16,
    ancount: u16,
}

fn u16_at(msg: &[u8], at: usize, what: &'static str) -> Result<u16, DnsError> {
    match msg.get(at..at + 2) {
        Some(&[a, b]) => Ok(u16::from_be_bytes([a, b])),
        _ => Err(truncated(what, at, 2, msg.len().saturating_sub(at))),
    }
}

fn header(msg: &[u8]) -> Result<Header, DnsError> {
    if msg.len() < HEADER_LEN {
        return Err(truncated("header", 0, HEADER_LEN, msg.len()));
    }
    Ok(Header {
        id: u16_at(msg, 0, "header")?,
        flags: u16_at(msg, 2, "header")?,
        qdcount: u16_at(msg, 4, "header")?,
        ancount: u16_at(msg, 6, "header")?,
    })
}

/// Walks the name starting at `start` and returns the offset just after it in the message
/// (after its first pointer, if compressed). Pointers must point strictly backwards and are
/// followed at most [`MAX_HOPS`] times, so every walk ends; with `allow_pointers` false a
/// pointer is an error.
fn skip_name(msg: &[u8], start: usize, allow_pointers: bool) -> Result<usize, DnsError> {
    let mut pos = start;
    let mut end = None;
    let mut hops = 0;
    let mut wire_len = 0;
    loop {
        let Some(&b) = msg.get(pos) else {
            return Err(truncated("name", pos, 1, 0));
        };
        match b & 0xc0 {
            0x00 => {
                let n = usize::from(b);
                wire_len += 1 + n;
                if wire_len > MAX_NAME_LEN {
                    return Err(malformed("name", start, "longer than 255 bytes"));
                }
                if n == 0 {
                    return Ok(end.unwrap_or(pos + 1));
                }
                let have = msg.len() - pos - 1;
                if have < n {
                    return Err(truncated("name label", pos, 1 + n, 1 + have));
                }
                pos += 1 + n;
            }
            0xc0 => {
                if !allow_pointers {
                    return Err(malformed(
                        "question name",
                        pos,
                        "compression pointer in a query (nothing precedes the question)",
                    ));
                }
                let Some(&lo) = msg.get(pos + 1) else {
                    return Err(truncated("compression pointer", pos, 2, 1));
                };
                let target = usize::from(u16::from_be_bytes([b & 0x3f, lo]));
                if target >= pos {
                    return Err(malformed(
                        "compression pointer",
                        pos,
                        "points forwards or at itself (a loop)",
                    ));
                }
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(malformed(
                        "compression pointer",
                        pos,
                        "too many hops (a loop)",
                    ));
                }
                end.get_or_insert(pos + 2);
                pos = target;
            }
            _ => return Err(malformed("name", pos, "reserved label type (0x40/0x80)")),
        }
    }
}

/// Skips one question (name, type, class) at `pos`; returns where it ends and its type.
fn skip_question(msg: &[u8], pos: usize, pointers: bool) -> Result<(usize, u16), DnsError> {
    let pos = skip_name(msg, pos, pointers)?;
    let qtype = u16_at(msg, pos, "question type")?;
    u16_at(msg, pos + 2, "question class")?;
    Ok((pos + 4, qtype))
}

/// Skips one resource record at `pos`; returns where it ends, its type and its data's range.
fn skip_rr(msg: &[u8], pos: usize) -> Result<(usize, u16, usize), DnsError> {
    let pos = skip_name(msg, pos, true)?;
    if msg.len() < pos + 10 {
        return Err(truncated("answer RR", pos, 10, msg.len() - pos));
    }
    let rtype = u16_at(msg, pos, "answer RR")?;
    let rdlen = usize::from(u16_at(msg, pos + 8, "answer RR")?);
    let data = pos + 10;
    let have = msg.len() - data;
    if have < rdlen {
        return Err(truncated("answer RDATA", data, rdlen, have));
    }
    Ok((data + rdlen, rtype, data))
}

/// Checked parse of one DNS message (without the TCP prefix) as a response: QR must be set;
/// header, question and answer RRs are walked with bounds checks (compression pointers followed
/// with a hop limit); errors say what and at which byte offset. Never panics, never loops.
pub fn parse_response(msg: &[u8]) -> Result<ResponseView, DnsError> {
    walk_response(msg, |_, _| {})
}

/// Walks a response, calling `each(type, rdata)` for every answer RR.
fn walk_response(msg: &[u8], mut each: impl FnMut(u16, &[u8])) -> Result<ResponseView, DnsError> {
    let h = header(msg)?;
    if h.flags & QR == 0 {
        return Err(malformed(
            "header",
            2,
            "QR bit clear: a query, not a response",
        ));
    }
    let mut pos = HEADER_LEN;
    for _ in 0..h.qdcount {
        pos = skip_question(msg, pos, true)?.0;
    }
    for _ in 0..h.ancount {
        let (end, rtype, data) = skip_rr(msg, pos)?;
        each(rtype, msg.get(data..end).unwrap_or_default());
        pos = end;
    }
    Ok(ResponseView {
        id: h.id,
        rcode: (h.flags & RCODE_MASK) as u8,
        truncated: h.flags & TC != 0,
        answers: h.ancount,
    })
}

/// [`parse_response`], and the authority and additional records walked too: a response
/// must end where its last record does. Bytes after it (a padded answer) are a malformed
/// message, not a NOERROR with garbage the reader never looked at.
pub fn parse_whole_response(msg: &[u8]) -> Result<ResponseView, DnsError> {
    let v = parse_response(msg)?;
    let h = header(msg)?;
    let mut pos = HEADER_LEN;
    for _ in 0..h.qdcount {
        pos = skip_question(msg, pos, true)?.0;
    }
    let rest = u32::from(h.ancount)
        + u32::from(u16_at(msg, 8, "header")?)
        + u32::from(u16_at(msg, 10, "header")?);
    for _ in 0..rest {
        pos = skip_rr(msg, pos)?.0;
    }
    if pos != msg.len() {
        return Err(malformed(
            "message",
            pos,
            "bytes after the last record (a padded answer)",
        ));
    }
    Ok(v)
}

/// The first A or AAAA address among a response's answers (checked like [`parse_response`]);
/// `None` when there is none.
pub fn first_answer_addr(msg: &[u8]) -> Result<Option<IpAddr>, DnsError> {
    let mut found = None;
    walk_response(msg, |rtype, data| {
        if found.is_some() {
            return;
        }
        found = match (rtype, data.len()) {
            (TYPE_A, 4) => <[u8; 4]>::try_from(data)
                .ok()
                .map(|b| Ipv4Addr::from(b).into()),
            (TYPE_AAAA, 16) => <[u8; 16]>::try_from(data)
                .ok()
                .map(|b| Ipv6Addr::from(b).into()),
            _ => None,
        };
    })?;
    Ok(found)
}

/// Checked parse of one DNS message (without the TCP prefix) as a standard query: QR clear,
/// opcode QUERY, exactly one question whose name is not compressed. Records after the question
/// (an EDNS OPT, say) are not looked at: the answer does not carry them.
pub fn parse_query(msg: &[u8]) -> Result<QueryView, DnsError> {
    let h = header(msg)?;
    if h.flags & QR != 0 {
        return Err(malformed(
            "header",
            2,
            "QR bit set: a response, not a query",
        ));
    }
    if h.flags & OPCODE_MASK != 0 {
        return Err(malformed("header", 2, "opcode is not QUERY"));
    }
    if h.qdcount != 1 {
        return Err(malformed("header", 4, "question count is not 1"));
    }
    let (question_end, qtype) = skip_question(msg, HEADER_LEN, false)?;
    Ok(QueryView {
        id: h.id,
        qtype,
        question_end,
    })
}

/// Appends the TCP-framed response to `query` (as parsed): same id and question, QR+RA set,
/// NOERROR, and for qtype A one answer (name = pointer to the question, TTL 60, `a`); AAAA →
/// one AAAA answer with `aaaa`; other types: no answer. RD is copied from the query.
///
/// `q` must come from [`parse_query`] on `query`; if it does not fit `query`, the response
/// carries no question and no answer rather than panicking.
pub fn write_tcp_response(
    out: &mut Vec<u8>,
    query: &[u8],
    q: &QueryView,
    a: Ipv4Addr,
    aaaa: Ipv6Addr,
) {
    let question = query.get(HEADER_LEN..q.question_end).unwrap_or_default();
    let query_flags = query
        .get(2..4)
        .map_or(0, |f| u16::from_be_bytes([f[0], f[1]]));
    let rdata: &[u8] = match q.qtype {
        _ if question.is_empty() => &[],
        TYPE_A => &a.octets(),
        TYPE_AAAA => &aaaa.octets(),
        _ => &[],
    };
    // Checked by parse_query: a question is at most 255 + 4 bytes, so this fits 16 bits.
    let answer_len = if rdata.is_empty() {
        0
    } else {
        12 + rdata.len()
    };
    let len = HEADER_LEN + question.len() + answer_len;
    out.reserve(2 + len);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&q.id.to_be_bytes());
    out.extend_from_slice(&(QR | (query_flags & RD) | RA).to_be_bytes());
    out.extend_from_slice(&u16::from(!question.is_empty()).to_be_bytes());
    out.extend_from_slice(&u16::from(!rdata.is_empty()).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]); // NS=AR=0
    out.extend_from_slice(question);
    if !rdata.is_empty() {
        out.extend_from_slice(&[0xc0, HEADER_LEN as u8]); // pointer to the question's name
        out.extend_from_slice(&q.qtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&ANSWER_TTL.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(rdata);
    }
}

/// Body of the `dns` fuzz target: every parser over `data`, and for a query that parses, the
/// answer we would send must parse as a response with the same id. Must never panic.
pub fn fuzz_dns(data: &[u8]) {
    let _ = tcp_message_len(data);
    let _ = parse_response(data);
    let _ = first_answer_addr(data);
    if let Ok(q) = parse_query(data) {
        let mut out = Vec::with_capacity(data.len() + 32);
        write_tcp_response(
            &mut out,
            data,
            &q,
            Ipv4Addr::new(198, 18, 0, 53),
            Ipv6Addr::LOCALHOST,
        );
        let framed = tcp_message_len(&out);
        assert_eq!(framed, Some(out.len()), "response framing");
        let r = parse_response(out.get(2..).unwrap_or_default());
        assert!(
            matches!(r, Ok(ResponseView { id, rcode: 0, .. }) if id == q.id),
            "our answer to a parsed query must parse: {r:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK: u8 = 0xa5;

    fn name(s: &str) -> Name {
        s.parse().unwrap()
    }

    fn query(id: u16, qname: &str, qtype: u16) -> Vec<u8> {
        let mut out = Vec::new();
        write_tcp_query(&mut out, id, &name(qname), qtype);
        out
    }

    #[test]
    fn names_parse_and_say_why_not() {
        assert_eq!(
            name("www.example.com").as_wire(),
            b"\x03www\x07example\x03com\x00"
        );
        assert_eq!(
            name("example.com.").as_wire(),
            name("example.com").as_wire()
        );
        assert_eq!(name(".").as_wire(), b"\x00");
        assert_eq!(name("www.example.com.").to_string(), "www.example.com");
        assert_eq!(Name::root().to_string(), ".");
        let why = |s: &str| s.parse::<Name>().unwrap_err().to_string();
        assert!(why("").contains("empty"));
        assert!(why("a..b").contains("label 2 is empty"));
        assert!(why(&format!("{}.com", "x".repeat(64))).contains("64 bytes, at most 63"));
        assert!(why("a b.com").contains("printable"));
        assert!(why("ä.com").contains("printable"));
        // 4 × (1 + 63) + 1 = 257 bytes.
        let long = vec!["y".repeat(63); 4].join(".");
        assert!(why(&long).contains("257 bytes in wire form"));
        let just = format!("{}.{}", vec!["y".repeat(63); 3].join("."), "z".repeat(61));
        assert_eq!(name(&just).as_wire().len(), 255);
    }

    #[test]
    fn qtypes_parse() {
        assert_eq!(qtype_from_str("A"), Ok(1));
        assert_eq!(qtype_from_str("aaaa"), Ok(28));
        assert_eq!(qtype_from_str("SRV"), Ok(33));
        assert_eq!(qtype_from_str("ANY"), Ok(255));
        assert_eq!(qtype_from_str("TXT"), Ok(16));
        assert_eq!(qtype_from_str("65"), Ok(65));
        assert_eq!(qtype_from_str("TYPE65"), Ok(65));
        assert!(qtype_from_str("65536").is_err());
        assert!(qtype_from_str("").is_err());
        assert!(qtype_from_str("AXFRX")
            .unwrap_err()
            .to_string()
            .contains("\"AXFRX\""));
    }

    #[test]
    fn query_bytes_exact_and_appended_after_marker() {
        let mut out = vec![MARK; 3];
        write_tcp_query(&mut out, 0xbeef, &name("ab.c"), TYPE_AAAA);
        let want: &[u8] = &[
            MARK, MARK, MARK, // untouched
            0, 22, // length: 12 + 6 + 4
            0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, // header, RD
            2, b'a', b'b', 1, b'c', 0, // name
            0, 28, 0, 1, // AAAA IN
        ];
        assert_eq!(out, want);
    }

    #[test]
    fn query_round_trip() {
        for (qname, qtype) in [("example.com", TYPE_A), (".", TYPE_NS), ("a.b.c.d", 999)] {
            let wire = query(7, qname, qtype);
            assert_eq!(tcp_message_len(&wire), Some(wire.len()));
            let q = parse_query(&wire[2..]).unwrap();
            assert_eq!((q.id, q.qtype, q.question_end), (7, qtype, wire.len() - 2));
        }
    }

    #[test]
    fn response_round_trip_a_aaaa_other() {
        let a = Ipv4Addr::new(198, 18, 0, 53);
        let aaaa: Ipv6Addr = "fd00:53::53".parse().unwrap();
        for (qtype, want) in [
            (TYPE_A, Some(IpAddr::from(a))),
            (TYPE_AAAA, Some(aaaa.into())),
            (TYPE_MX, None),
        ] {
            let wire = query(0x1234, "www.example", qtype);
            let q = parse_query(&wire[2..]).unwrap();
            let mut out = vec![MARK];
            write_tcp_response(&mut out, &wire[2..], &q, a, aaaa);
            assert_eq!(out[0], MARK);
            let resp = &out[1..];
            assert_eq!(tcp_message_len(resp), Some(resp.len()));
            let r = parse_response(&resp[2..]).unwrap();
            assert_eq!(
                r,
                ResponseView {
                    id: 0x1234,
                    rcode: 0,
                    truncated: false,
                    answers: u16::from(want.is_some()),
                }
            );
            assert_eq!(first_answer_addr(&resp[2..]).unwrap(), want);
            // QR, RD (copied), RA; the question is the query's, byte for byte.
            assert_eq!(&resp[4..6], &[0x81, 0x80]);
            assert_eq!(&resp[14..14 + wire.len() - 14], &wire[14..]);
        }
    }

    #[test]
    fn a_answer_bytes_exact() {
        let wire = query(1, "x", TYPE_A);
        let q = parse_query(&wire[2..]).unwrap();
        let mut out = Vec::new();
        write_tcp_response(
            &mut out,
            &wire[2..],
            &q,
            Ipv4Addr::new(1, 2, 3, 4),
            Ipv6Addr::UNSPECIFIED,
        );
        let answer = &out[2 + 12 + 3 + 4..];
        assert_eq!(
            answer,
            &[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 1, 2, 3, 4]
        );
    }

    #[test]
    fn every_cut_is_an_error_not_a_panic() {
        let wire = query(9, "www.example.com", TYPE_A);
        let msg = &wire[2..];
        for cut in 0..msg.len() {
            assert!(parse_query(&msg[..cut]).is_err(), "query cut at {cut}");
            assert_eq!(
                tcp_message_len(&wire[..cut + 2]),
                None,
                "frame cut at {cut}"
            );
        }
        let q = parse_query(msg).unwrap();
        let mut out = Vec::new();
        write_tcp_response(&mut out, msg, &q, Ipv4Addr::LOCALHOST, Ipv6Addr::LOCALHOST);
        let resp = &out[2..];
        for cut in 0..resp.len() {
            assert!(
                parse_response(&resp[..cut]).is_err(),
                "response cut at {cut}"
            );
            assert!(
                first_answer_addr(&resp[..cut]).is_err(),
                "response cut at {cut}"
            );
        }
    }

    #[test]
    fn errors_name_what_and_where() {
        assert_eq!(
            parse_response(&[0; 5]).unwrap_err().to_string(),
            "DNS header truncated at offset 0: need 12 bytes, have 5"
        );
        let wire = query(9, "www.example.com", TYPE_A);
        assert!(parse_response(&wire[2..])
            .unwrap_err()
            .to_string()
            .contains("QR bit clear"));
        let mut cut = wire[2..].to_vec();
        cut.truncate(14);
        assert_eq!(
            parse_query(&cut).unwrap_err().to_string(),
            "DNS name label truncated at offset 12: need 4 bytes, have 2"
        );
    }

    /// A response header with QD=0, AN=1 followed by `rr`.
    fn response_with_answer(rr: &[u8]) -> Vec<u8> {
        let mut m = vec![0, 1, 0x81, 0x80, 0, 0, 0, 1, 0, 0, 0, 0];
        m.extend_from_slice(rr);
        m
    }

    #[test]
    fn compression_loops_are_errors() {
        // A pointer to itself.
        let m = response_with_answer(&[0xc0, 12]);
        assert!(parse_response(&m).unwrap_err().to_string().contains("loop"));
        // Two labels pointing at each other: the second points forwards.
        let m = response_with_answer(&[1, b'a', 0xc0, 16, 1, b'b', 0xc0, 12]);
        assert!(parse_response(&m).is_err());
        // A pointer into itself via a label: backwards pointer to the pointer's own label.
        let m = response_with_answer(&[1, b'a', 0xc0, 12]);
        assert!(parse_response(&m).unwrap_err().to_string().contains("hops"));
        // Reserved label types.
        let m = response_with_answer(&[0x40, 0]);
        assert!(parse_response(&m)
            .unwrap_err()
            .to_string()
            .contains("reserved"));
        // A legal backward pointer works.
        let mut m = vec![
            0, 1, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1,
        ];
        m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 9, 9, 9, 9]);
        assert_eq!(parse_response(&m).unwrap().answers, 1);
        assert_eq!(
            first_answer_addr(&m).unwrap(),
            Some(IpAddr::from([9, 9, 9, 9]))
        );
    }

    #[test]
    fn queries_refuse_what_a_server_cannot_answer() {
        let good = query(3, "a.b", TYPE_A);
        let msg = good[2..].to_vec();
        let mut m = msg.clone();
        m[2] |= 0x80; // QR
        assert!(parse_query(&m).is_err());
        let mut m = msg.clone();
        m[2] |= 0x28; // opcode 5 (UPDATE)
        assert!(parse_query(&m).unwrap_err().to_string().contains("opcode"));
        let mut m = msg.clone();
        m[5] = 2; // two questions
        assert!(parse_query(&m).unwrap_err().to_string().contains("count"));
        let mut m = msg[..12].to_vec();
        m.extend_from_slice(&[0xc0, 0, 0, 1, 0, 1]);
        assert!(parse_query(&m).unwrap_err().to_string().contains("pointer"));
        // Trailing records (EDNS OPT) are ignored, not refused.
        let mut m = msg.clone();
        m[11] = 1;
        m.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_query(&m).unwrap().question_end, msg.len());
    }

    #[test]
    fn name_longer_than_255_in_a_message_is_refused() {
        let mut m = vec![0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for _ in 0..5 {
            m.push(63);
            m.extend_from_slice(&[b'x'; 63]);
        }
        m.extend_from_slice(&[0, 0, 1, 0, 1]);
        assert!(parse_query(&m).unwrap_err().to_string().contains("255"));
    }

    #[test]
    fn mismatched_view_does_not_panic() {
        let q = QueryView {
            id: 1,
            qtype: TYPE_A,
            question_end: 400,
        };
        let mut out = Vec::new();
        write_tcp_response(
            &mut out,
            &[0; 20],
            &q,
            Ipv4Addr::LOCALHOST,
            Ipv6Addr::LOCALHOST,
        );
        let r = parse_response(&out[2..]).unwrap();
        assert_eq!(r.answers, 0);
    }

    #[test]
    fn marker_buffers_never_panic() {
        for len in 0..300 {
            for mark in [0x00, 0xa5, 0xc0, 0xff, 0x3f, 0x01] {
                fuzz_dns(&vec![mark; len]);
            }
        }
    }

    /// Issue 11: an answer longer than its DNS message is malformed (load counted it NOERROR).
    #[test]
    fn a_padded_response_is_not_a_whole_response() {
        let mut tq = Vec::new();
        write_tcp_query(&mut tq, 7, &name("example.com"), TYPE_A);
        let q = tq[2..].to_vec();
        let view = parse_query(&q).unwrap();
        let mut out = Vec::new();
        write_tcp_response(
            &mut out,
            &q,
            &view,
            Ipv4Addr::new(198, 18, 0, 53),
            Ipv6Addr::LOCALHOST,
        );
        let msg = &out[2..];
        assert_eq!(parse_whole_response(msg).unwrap().id, 7);
        let mut padded = msg.to_vec();
        padded.extend_from_slice(&[0; 16]);
        assert!(
            parse_response(&padded).is_ok(),
            "the lenient walk stops at the answers"
        );
        let e = parse_whole_response(&padded).unwrap_err();
        assert!(e.to_string().contains("padded"), "{e}");
    }

    #[test]
    fn fuzz_body_over_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("dns");
        for seed in &seeds {
            let data = &seed.bytes;
            fuzz_dns(data);
            // Every cut and every single-byte flip of each seed, too.
            for cut in 0..data.len() {
                fuzz_dns(&data[..cut]);
            }
            let mut m = data.clone();
            for i in 0..m.len() {
                for x in [0x01, 0x40, 0xc0, 0xff] {
                    m[i] ^= x;
                    fuzz_dns(&m);
                    m[i] ^= x;
                }
            }
        }
        let n = seeds.len();
        assert!(n >= 12, "seed corpus has {n} files, expected at least 12");
    }
}
