//! HTTP/1 requests a client pipelined: sent before the server answered the request before
//! them, so they share that request's turn. copy's requests are turns (client bytes between
//! two server turns, `requests.at_source`), whatever the protocol; this counts the HTTP/1
//! requests hidden inside them apart (`requests.pipelined`), so that `at_source + pipelined`
//! is what a server's access log counts. A keep-alive load that keeps its schedule while the
//! server is slow pipelines: in a 75 s soak run, 467 of the 212,405 requests of its 50
//! connections (50 a second each) went before the answer to the one before, and at_source
//! fell short of nginx's log by exactly 467 in both copies, with no frame dropped.
//!
//! The framing itself (untrusted bytes, nothing buffered, every length bounded) is
//! tcpkit-wire's [`RequestFramer`]; this only keeps whether the server answered since the last
//! request began.

use tcpkit_wire::http::RequestFramer;

/// One session's client stream, its HTTP/1 requests counted as pipelined or not.
#[derive(Debug, Default)]
pub struct Pipeline {
    framer: RequestFramer,
    /// A request began in this session.
    begun: bool,
    /// The server sent bytes since the last request began.
    answered: bool,
}

impl Pipeline {
    /// The server sent bytes (or the capture lost some of them): the request in progress was
    /// answered, at least in part.
    pub fn server(&mut self) {
        self.answered = true;
    }

    /// The client's next bytes; returns how many requests began in them before the server
    /// answered the one before (pipelined). Of several begun in one read, each after the
    /// first went before an answer to the one before it.
    pub fn client(&mut self, data: &[u8]) -> u64 {
        let begun = self.framer.feed(data);
        if begun == 0 {
            return 0;
        }
        let first = u64::from(self.begun && !self.answered);
        self.begun = true;
        self.answered = false;
        begun - 1 + first
    }
}

/// Body of the `copy_pipeline` fuzz target, public so a stable test runs it over the seed
/// corpus: the framer's own checks (tcpkit-wire's), and the same of the pipelined counts
/// (framing must not depend on where the reads were cut, no read may count more requests
/// than it could hold).
pub fn fuzz_pipeline(data: &[u8]) {
    tcpkit_wire::http::fuzz_request_framer(data);
    tcpkit_wire::http::counts_agree_across_reads(data, Pipeline::client);
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn requests_before_the_answer_to_the_one_before_count_as_pipelined() {
        let mut p = Pipeline::default();
        assert_eq!(p.client(GET), 0, "the first request");
        p.server();
        assert_eq!(p.client(GET), 0, "after its answer");
        // Three in one read, then one more, and no answer to the second yet: all pipelined.
        assert_eq!(p.client(&[GET, GET, GET].concat()), 3);
        assert_eq!(p.client(GET), 1);
        p.server();
        // A head cut anywhere, over several reads.
        let two = [GET, GET].concat();
        let (a, b) = two.split_at(GET.len() + 5);
        assert_eq!(p.client(&a[..3]) + p.client(&a[3..]) + p.client(b), 1);
    }

    #[test]
    fn a_request_after_an_answer_to_the_head_before_it_is_not_pipelined() {
        // The answer to a request's head (100 Continue) before its body: the request after
        // the body went after an answer.
        let mut p = Pipeline::default();
        assert_eq!(p.client(b"PUT /f HTTP/1.1\r\ncontent-length: 3\r\n\r\n"), 0);
        p.server();
        assert_eq!(p.client(&[b"abc", GET].concat()), 0);
        // Unanswered, the body passed over: the next one is pipelined.
        let mut p = Pipeline::default();
        let post = b"POST /f HTTP/1.1\r\nContent-Length: 20\r\n\r\nGET / HTTP/1.1\r\n\r\nxx";
        assert_eq!(p.client(post), 0);
        assert_eq!(p.client(GET), 1);
    }

    #[test]
    fn the_fuzz_body_holds_over_the_seed_corpus() {
        let seeds = tcpkit_lab::corpus::seeds("copy_pipeline");
        assert!(!seeds.is_empty());
        for seed in seeds {
            fuzz_pipeline(&seed.bytes);
        }
    }

    #[test]
    fn fuzz_body_holds_on_plain_streams() {
        fuzz_pipeline(
            &[3u8]
                .iter()
                .chain([GET, GET, GET].concat().iter())
                .copied()
                .collect::<Vec<_>>(),
        );
        fuzz_pipeline(
            b"\x07POST /f HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n",
        );
    }
}
