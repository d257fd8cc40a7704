//! What oxadbd writes to a FunctionFS `ep0` before the gadget can be bound:
//! the ADB interface's descriptors and its strings. Pure: bytes out, no I/O.
//!
//! Layouts are the kernel's UAPI (`linux/usb/functionfs.h`, `linux/usb/ch9.h`),
//! all little endian. FunctionFS numbers the endpoint files in the order the
//! endpoint descriptors appear, so the bulk-out endpoint (host to device) is
//! `ep1` and the bulk-in endpoint is `ep2`.

use oxadb_wire::usb::{
    ADB_CLASS, ADB_PROTOCOL, ADB_SUBCLASS, FULL_SPEED_BULK_MAX_PACKET, HIGH_SPEED_BULK_MAX_PACKET,
    SUPER_SPEED_BULK_MAX_PACKET,
};

/// `FUNCTIONFS_DESCRIPTORS_MAGIC_V2`: a header with flags, then counts.
pub const DESCRIPTORS_MAGIC_V2: u32 = 3;
/// `FUNCTIONFS_STRINGS_MAGIC`.
pub const STRINGS_MAGIC: u32 = 2;
/// `FUNCTIONFS_HAS_FS_DESC`: full-speed descriptors follow.
pub const HAS_FS_DESC: u32 = 1;
/// `FUNCTIONFS_HAS_HS_DESC`: high-speed descriptors follow.
pub const HAS_HS_DESC: u32 = 2;
/// `FUNCTIONFS_HAS_SS_DESC`: super-speed descriptors follow.
pub const HAS_SS_DESC: u32 = 4;

/// The interface's name (string 1), as hosts list it.
pub const INTERFACE_NAME: &str = "ADB Interface";
/// US English, the one language of the strings table.
pub const LANGUAGE_EN_US: u16 = 0x0409;

/// Endpoint 1, direction OUT (host to device): the host's packets.
pub const BULK_OUT_ADDRESS: u8 = 0x01;
/// Endpoint 2, direction IN (device to host): the device's packets.
pub const BULK_IN_ADDRESS: u8 = 0x82;
/// The endpoint files FunctionFS creates for them.
pub const BULK_OUT_FILE: &str = "ep1";
pub const BULK_IN_FILE: &str = "ep2";

/// Packets a super-speed bulk endpoint may burst, minus one (USB 3.2,
/// 9.6.7): bursts of five, the figure adbd advertises too.
pub const SUPER_SPEED_MAX_BURST: u8 = 4;

const USB_DT_INTERFACE: u8 = 4;
const USB_DT_ENDPOINT: u8 = 5;
const USB_DT_SS_ENDPOINT_COMP: u8 = 0x30;
const USB_ENDPOINT_XFER_BULK: u8 = 2;
const INTERFACE_LEN: u8 = 9;
/// `usb_endpoint_descriptor_no_audio`: no bRefresh/bSynchAddress.
const ENDPOINT_LEN: u8 = 7;
const SS_COMPANION_LEN: u8 = 6;

fn interface(out: &mut Vec<u8>) {
    out.extend_from_slice(&[
        INTERFACE_LEN,
        USB_DT_INTERFACE,
        0, // bInterfaceNumber: FunctionFS renumbers it within the configuration
        0, // bAlternateSetting
        2, // bNumEndpoints
        ADB_CLASS,
        ADB_SUBCLASS,
        ADB_PROTOCOL,
        1, // iInterface: the first string of the table
    ]);
}

fn bulk_endpoint(out: &mut Vec<u8>, address: u8, max_packet: u16) {
    out.extend_from_slice(&[
        ENDPOINT_LEN,
        USB_DT_ENDPOINT,
        address,
        USB_ENDPOINT_XFER_BULK,
    ]);
    out.extend_from_slice(&max_packet.to_le_bytes());
    out.push(0); // bInterval: unused by bulk endpoints
}

fn ss_companion(out: &mut Vec<u8>) {
    out.extend_from_slice(&[
        SS_COMPANION_LEN,
        USB_DT_SS_ENDPOINT_COMP,
        SUPER_SPEED_MAX_BURST,
        0, // bmAttributes: no streams
        0, // wBytesPerInterval: periodic endpoints only
        0,
    ]);
}

/// The interface and its two bulk endpoints at one speed; returns how many
/// descriptors were written (the header counts them).
fn function(out: &mut Vec<u8>, max_packet: u16, companions: bool) -> u32 {
    interface(out);
    let mut count = 1;
    for address in [BULK_OUT_ADDRESS, BULK_IN_ADDRESS] {
        bulk_endpoint(out, address, max_packet);
        count += 1;
        if companions {
            ss_companion(out);
            count += 1;
        }
    }
    count
}

/// The v2 descriptors blob: full, high and super speed, each an interface
/// (class 0xff, subclass 0x42, protocol 1) with bulk OUT 0x01 and bulk IN
/// 0x82, at 64, 512 and 1024 bytes per packet; super speed adds an endpoint
/// companion after each endpoint.
pub fn descriptors() -> Vec<u8> {
    let mut body = Vec::new();
    let fs = function(&mut body, FULL_SPEED_BULK_MAX_PACKET, false);
    let hs = function(&mut body, HIGH_SPEED_BULK_MAX_PACKET, false);
    let ss = function(&mut body, SUPER_SPEED_BULK_MAX_PACKET, true);
    let mut out = Vec::with_capacity(24 + body.len());
    out.extend_from_slice(&DESCRIPTORS_MAGIC_V2.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // length, filled in below
    out.extend_from_slice(&(HAS_FS_DESC | HAS_HS_DESC | HAS_SS_DESC).to_le_bytes());
    for count in [fs, hs, ss] {
        out.extend_from_slice(&count.to_le_bytes());
    }
    out.extend_from_slice(&body);
    let len = u32::try_from(out.len()).expect("descriptors are small");
    out[4..8].copy_from_slice(&len.to_le_bytes());
    out
}

/// The strings blob: one language (US English) with one string, the
/// interface's name, NUL-terminated.
pub fn strings(interface_name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&STRINGS_MAGIC.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // length, filled in below
    out.extend_from_slice(&1u32.to_le_bytes()); // str_count
    out.extend_from_slice(&1u32.to_le_bytes()); // lang_count
    out.extend_from_slice(&LANGUAGE_EN_US.to_le_bytes());
    // A NUL inside would end the string early and shift the table.
    out.extend(interface_name.bytes().filter(|&b| b != 0));
    out.push(0);
    let len = u32::try_from(out.len()).expect("strings are small");
    out[4..8].copy_from_slice(&len.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_byte_for_byte() {
        #[rustfmt::skip]
        let expected: Vec<u8> = vec![
            // Header: magic 3, length 105, flags FS|HS|SS.
            3, 0, 0, 0,  105, 0, 0, 0,  7, 0, 0, 0,
            // Counts: 3 full speed, 3 high speed, 5 super speed.
            3, 0, 0, 0,  3, 0, 0, 0,  5, 0, 0, 0,
            // Full speed: interface, bulk OUT 0x01 and IN 0x82 at 64 bytes.
            9, 4, 0, 0, 2, 0xff, 0x42, 1, 1,
            7, 5, 0x01, 2, 64, 0, 0,
            7, 5, 0x82, 2, 64, 0, 0,
            // High speed: 512 bytes.
            9, 4, 0, 0, 2, 0xff, 0x42, 1, 1,
            7, 5, 0x01, 2, 0x00, 0x02, 0,
            7, 5, 0x82, 2, 0x00, 0x02, 0,
            // Super speed: 1024 bytes, each endpoint followed by its companion
            // (bMaxBurst 4).
            9, 4, 0, 0, 2, 0xff, 0x42, 1, 1,
            7, 5, 0x01, 2, 0x00, 0x04, 0,
            6, 0x30, 4, 0, 0, 0,
            7, 5, 0x82, 2, 0x00, 0x04, 0,
            6, 0x30, 4, 0, 0, 0,
        ];
        assert_eq!(expected.len(), 24 + 23 + 23 + 35);
        assert_eq!(descriptors(), expected);
    }

    #[test]
    fn strings_byte_for_byte() {
        let mut expected: Vec<u8> = vec![
            2, 0, 0, 0, // magic
            32, 0, 0, 0, // length: 16 header + 2 language + 14 string
            1, 0, 0, 0, // one string
            1, 0, 0, 0, // in one language
            0x09, 0x04, // en-US
        ];
        expected.extend_from_slice(b"ADB Interface\0");
        assert_eq!(strings(INTERFACE_NAME), expected);
        // An embedded NUL cannot cut the table short.
        assert_eq!(strings("A\0B").len(), 18 + 3);
    }
}
