//! A failed TLS handshake named: a short [`Reason`] to count by (the report's `failures`) and
//! one line that says what happened and what to do about it (`--tls-ca`, `--tls-sni`, ...).

use std::io;

use rustls::{AlertDescription, CertificateError, Error, PeerIncompatible};

use crate::session::HandshakeError;

/// Why a handshake failed, as counted in reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The certificate chain ends at no CA this side trusts.
    UnknownCa,
    /// The certificate does not name the server asked for (SNI).
    BadName,
    /// The certificate is past its notAfter (or before its notBefore).
    Expired,
    /// No TLS version or cipher suite both sides accept.
    NoCommonProtocol,
    /// No ALPN protocol both sides accept.
    NoAlpn,
    /// The handshake did not complete within its deadline.
    HandshakeTimeout,
    /// The peer closed or reset the connection during the handshake.
    Reset,
    Other,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::UnknownCa,
        Reason::BadName,
        Reason::Expired,
        Reason::NoCommonProtocol,
        Reason::NoAlpn,
        Reason::HandshakeTimeout,
        Reason::Reset,
        Reason::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UnknownCa => "unknown_ca",
            Reason::BadName => "bad_name",
            Reason::Expired => "expired",
            Reason::NoCommonProtocol => "no_common_protocol",
            Reason::NoAlpn => "no_alpn",
            Reason::HandshakeTimeout => "handshake_timeout",
            Reason::Reset => "reset",
            Reason::Other => "other",
        }
    }

    /// As counted among a report's errors (`TLS unknown_ca`).
    pub fn error_name(self) -> &'static str {
        match self {
            Reason::UnknownCa => "TLS unknown_ca",
            Reason::BadName => "TLS bad_name",
            Reason::Expired => "TLS expired",
            Reason::NoCommonProtocol => "TLS no_common_protocol",
            Reason::NoAlpn => "TLS no_alpn",
            Reason::HandshakeTimeout => "TLS handshake_timeout",
            Reason::Reset => "TLS reset",
            Reason::Other => "TLS other",
        }
    }

    /// The reason of a handshake error, on either side (a server learns of its certificate's
    /// rejection from the client's alert).
    pub fn of(e: &HandshakeError) -> Reason {
        match e {
            HandshakeError::Tls(e) => Reason::of_tls(e),
            HandshakeError::Eof => Reason::Reset,
            HandshakeError::Io(e) => match e.kind() {
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof => Reason::Reset,
                io::ErrorKind::TimedOut => Reason::HandshakeTimeout,
                _ => Reason::Other,
            },
        }
    }

    fn of_tls(e: &Error) -> Reason {
        match e {
            Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer => Reason::UnknownCa,
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => Reason::BadName,
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => Reason::Expired,
                _ => Reason::Other,
            },
            Error::AlertReceived(a) => match a {
                AlertDescription::UnknownCA => Reason::UnknownCa,
                AlertDescription::CertificateExpired => Reason::Expired,
                AlertDescription::ProtocolVersion
                | AlertDescription::HandshakeFailure
                | AlertDescription::InsufficientSecurity => Reason::NoCommonProtocol,
                AlertDescription::NoApplicationProtocol => Reason::NoAlpn,
                _ => Reason::Other,
            },
            Error::PeerIncompatible(_) => Reason::NoCommonProtocol,
            Error::NoApplicationProtocol => Reason::NoAlpn,
            _ => Reason::Other,
        }
    }
}

/// What this side offered, quoted when the two sides found nothing in common.
#[derive(Debug, Clone, Copy)]
pub struct Offer<'a> {
    /// The name asked for (client) or served (server).
    pub name: &'a str,
    /// `TLSv1.2 and TLSv1.3`, `TLSv1.3 only`...
    pub versions: &'a str,
    /// ALPN protocols offered (client) or accepted (server); empty: none.
    pub alpn: &'a [String],
    /// The flag that chose the trust (`--tls-ca FILE`, `the system store`).
    pub trust: &'a str,
}

/// A failed handshake: its reason and the line that says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub detail: String,
}

impl Failure {
    /// Names handshake error `e` of a side that offered `offer`.
    pub fn of(e: &HandshakeError, offer: &Offer<'_>) -> Failure {
        let reason = Reason::of(e);
        Failure {
            reason,
            detail: describe(e, reason, offer),
        }
    }

    /// No handshake within `limit`.
    pub fn timeout(limit: std::time::Duration) -> Failure {
        Failure {
            reason: Reason::HandshakeTimeout,
            detail: format!(
                "no handshake within {limit:?} (the peer may not speak TLS on this port)"
            ),
        }
    }
}

fn describe(e: &HandshakeError, reason: Reason, o: &Offer<'_>) -> String {
    let alpn = if o.alpn.is_empty() {
        "none".to_string()
    } else {
        o.alpn.join(",")
    };
    match (reason, e) {
        (Reason::UnknownCa, HandshakeError::Tls(Error::AlertReceived(_))) => {
            "the peer does not trust this certificate (alert unknown_ca)".into()
        }
        (Reason::UnknownCa, _) => format!(
            "certificate signed by an unknown CA (trusted: {}; --tls-ca FILE, or --insecure for a lab certificate)",
            o.trust
        ),
        (
            Reason::BadName,
            HandshakeError::Tls(Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                presented,
                ..
            })),
        ) => format!(
            "certificate not valid for {} (it names {}; --tls-sni NAME)",
            o.name,
            if presented.is_empty() {
                "nothing".to_string()
            } else {
                presented.join(", ")
            }
        ),
        (Reason::BadName, _) => format!("certificate not valid for {} (--tls-sni NAME)", o.name),
        (Reason::Expired, HandshakeError::Tls(Error::InvalidCertificate(c))) => match c {
            CertificateError::ExpiredContext { time, not_after } => format!(
                "certificate expired: notAfter {} (now {})",
                utc(not_after.as_secs()),
                utc(time.as_secs())
            ),
            CertificateError::NotValidYetContext { time, not_before } => format!(
                "certificate not valid yet: notBefore {} (now {})",
                utc(not_before.as_secs()),
                utc(time.as_secs())
            ),
            _ => format!("certificate outside its validity period ({c:?})"),
        },
        (Reason::Expired, _) => format!("the peer finds this certificate expired ({e})"),
        (Reason::NoCommonProtocol, _) => format!(
            "no common protocol: this side offered {}, the peer accepts none of it ({})",
            o.versions,
            peer_word(e)
        ),
        (Reason::NoAlpn, _) => format!(
            "no common ALPN protocol: this side offered {alpn}, the peer accepts none of them ({}; --alpn LIST)",
            peer_word(e)
        ),
        (Reason::Reset, _) => format!("connection closed by the peer during the handshake ({e})"),
        _ => e.to_string(),
    }
}

/// The peer's own word for a refusal: its alert, or what rustls saw in its hello.
fn peer_word(e: &HandshakeError) -> String {
    match e {
        HandshakeError::Tls(Error::AlertReceived(a)) => format!("alert {}", alert_name(*a)),
        HandshakeError::Tls(Error::PeerIncompatible(p)) => match p {
            PeerIncompatible::ServerDoesNotSupportTls12Or13 => {
                "it answered with a TLS version older than 1.2".into()
            }
            PeerIncompatible::Tls12NotOffered | PeerIncompatible::Tls12NotOfferedOrEnabled => {
                "it offered TLSv1.2 only".into()
            }
            PeerIncompatible::SupportedVersionsExtensionRequired => {
                "it offered TLSv1.2 or older only".into()
            }
            other => format!("{other:?}"),
        },
        other => other.to_string(),
    }
}

fn alert_name(a: AlertDescription) -> String {
    match a {
        AlertDescription::ProtocolVersion => "protocol_version".into(),
        AlertDescription::HandshakeFailure => "handshake_failure".into(),
        AlertDescription::InsufficientSecurity => "insufficient_security".into(),
        AlertDescription::NoApplicationProtocol => "no_application_protocol".into(),
        other => format!("{other:?}"),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` of Unix seconds (the civil-from-days algorithm, proleptic
/// Gregorian calendar).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
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
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn reasons_of_errors() {
        let tls = |e| Reason::of(&HandshakeError::Tls(e));
        assert_eq!(
            tls(Error::InvalidCertificate(CertificateError::UnknownIssuer)),
            Reason::UnknownCa
        );
        assert_eq!(
            tls(Error::InvalidCertificate(CertificateError::NotValidForName)),
            Reason::BadName
        );
        assert_eq!(
            tls(Error::InvalidCertificate(CertificateError::Expired)),
            Reason::Expired
        );
        assert_eq!(
            tls(Error::AlertReceived(AlertDescription::ProtocolVersion)),
            Reason::NoCommonProtocol
        );
        assert_eq!(
            tls(Error::AlertReceived(
                AlertDescription::NoApplicationProtocol
            )),
            Reason::NoAlpn
        );
        assert_eq!(Reason::of(&HandshakeError::Eof), Reason::Reset);
        let names: Vec<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), 8);
        assert!(names.contains(&"handshake_timeout"));
    }
}
