//! Packet I/O for a scripted device: the test side of a TCP connection to
//! the `oxadb` binary, one ADB packet at a time.

use std::io::{Read, Write};
use std::net::TcpStream;

use oxadb_wire::{Header, Packet, HEADER_LEN, MAX_PAYLOAD};

pub fn read_packet(socket: &mut TcpStream) -> Packet {
    let mut raw = [0u8; HEADER_LEN];
    socket.read_exact(&mut raw).unwrap();
    let header = Header::decode(&raw, MAX_PAYLOAD).unwrap();
    let mut payload = vec![0u8; header.data_length as usize];
    socket.read_exact(&mut payload).unwrap();
    Packet::new(header.command, header.arg0, header.arg1, payload)
}

pub fn send(socket: &mut TcpStream, packet: Packet) {
    socket.write_all(&packet.to_bytes(false)).unwrap();
}
