//! Packet I/O for a scripted device: the test side of a TCP connection to
//! the `oxadb` binary, one ADB packet at a time.

// Every test binary that includes this module uses only part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;

use oxadb_wire::{Command, Header, Packet, HEADER_LEN, MAX_PAYLOAD};

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

/// The next WRTE's payload, and how many OKAYs came before it.
pub fn next_write(socket: &mut TcpStream) -> (Vec<u8>, usize) {
    let mut okays = 0;
    loop {
        let packet = read_packet(socket);
        match packet.command {
            Command::Okay => okays += 1,
            Command::Wrte => return (packet.payload.to_vec(), okays),
            other => panic!("expected WRTE or OKAY, got {other:?}"),
        }
    }
}
