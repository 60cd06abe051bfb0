//! The worker's TLS handshakes (load --tls): moved on as the socket allows, timed from the
//! connect's end, a failure counted by reason and the connection retried as a failed connect is.

use super::*;

impl Worker<'_, '_> {
    /// Moves connection `i`'s TLS handshake on; once done it is timed (from the connect's
    /// end) and the connection is open; a failure is counted by reason and the connection
    /// retried as a failed connect is.
    pub(super) fn handshake(&mut self, i: usize) {
        let c = &mut self.conns[i];
        let Some(Sock::Tls(s, t)) = c.sock.as_mut() else {
            return;
        };
        match t.handshake(s) {
            Ok(false) => {}
            Ok(true) => {
                if self.sh.proto.h2.is_some() && t.alpn() != Some(&b"h2"[..]) {
                    // An HTTP/1.1 server would take the HTTP/2 preface for a bad request.
                    let chose = t.alpn().map_or_else(
                        || "none".to_string(),
                        |p| String::from_utf8_lossy(p).into_owned(),
                    );
                    let f = tcpkit_tls::Failure {
                        reason: tcpkit_tls::Reason::NoAlpn,
                        detail: format!(
                            "the server did not agree to HTTP/2 by ALPN (it chose {chose}): leave out --http2 (or --doh's HTTP/2 with --http1)"
                        ),
                    };
                    self.tls_failed(i, &f, now_ns());
                    return;
                }
                let ns = now_ns().saturating_sub(c.since);
                if let (Some(info), Some(tally)) = (t.info(), self.tls.as_mut()) {
                    tally.done(&info, t.alpn(), ns);
                }
                c.state = State::Open;
                self.opened();
                // HTTP/2's preface, written at the connect, goes once the session is up.
                if !self.conns[i].wbuf.is_empty() {
                    self.flush(i, now_ns());
                }
            }
            Err(e) => {
                let Some(tls) = self.sh.cfg.tls.as_ref() else {
                    return;
                };
                let f = tcpkit_tls::Failure::of(&e, &tls.offer());
                self.tls_failed(i, &f, now_ns());
            }
        }
    }

    pub(super) fn tls_failed(&mut self, i: usize, f: &tcpkit_tls::Failure, now: u64) {
        if let Some(tally) = self.tls.as_mut() {
            tally.failed(f);
        }
        self.count_error(f.reason.error_name());
        self.conns[i].sock = None;
        self.retry_later(i, now);
    }
}
