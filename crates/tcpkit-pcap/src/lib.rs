//! tcpkit-pcap
