//! Finding the ADB interface in a configuration descriptor.

use nusb::descriptors::{ConfigurationDescriptor, TransferType};
use nusb::transfer::Direction;
use oxadb_wire::usb::{ADB_CLASS, ADB_PROTOCOL, ADB_SUBCLASS};

/// Where ADB lives on a device: its interface and the two bulk endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdbInterface {
    pub number: u8,
    pub alt_setting: u8,
    /// `bEndpointAddress` of the bulk IN endpoint (device to host).
    pub endpoint_in: u8,
    /// `bEndpointAddress` of the bulk OUT endpoint (host to device).
    pub endpoint_out: u8,
}

/// Whether an interface's class triple marks an ADB function (AOSP
/// `is_adb_interface`: vendor class 0xff, subclass 0x42, protocol 1).
pub(crate) fn is_adb_class(class: u8, subclass: u8, protocol: u8) -> bool {
    (class, subclass, protocol) == (ADB_CLASS, ADB_SUBCLASS, ADB_PROTOCOL)
}

/// The first interface (any alternate setting) of `config` with ADB's class
/// triple and one bulk IN and one bulk OUT endpoint. An interface with the
/// triple but without both endpoints is skipped, as AOSP's host does: ADB
/// needs exactly those two pipes.
pub(crate) fn find_adb_interface(config: &ConfigurationDescriptor<'_>) -> Option<AdbInterface> {
    config.interface_alt_settings().find_map(|alt| {
        if !is_adb_class(alt.class(), alt.subclass(), alt.protocol()) {
            return None;
        }
        let mut endpoint_in = None;
        let mut endpoint_out = None;
        for endpoint in alt.endpoints() {
            if endpoint.transfer_type() != TransferType::Bulk {
                continue;
            }
            let slot = match endpoint.direction() {
                Direction::In => &mut endpoint_in,
                Direction::Out => &mut endpoint_out,
            };
            slot.get_or_insert(endpoint.address());
        }
        Some(AdbInterface {
            number: alt.interface_number(),
            alt_setting: alt.alternate_setting(),
            endpoint_in: endpoint_in?,
            endpoint_out: endpoint_out?,
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An interface `(number, alt, class, subclass, protocol)` with its
    /// endpoints `(address, bmAttributes, wMaxPacketSize)`.
    type TestInterface<'a> = ((u8, u8, u8, u8, u8), &'a [(u8, u8, u16)]);

    /// A configuration descriptor: 9-byte header, then each interface
    /// descriptor followed by its endpoint descriptors.
    pub(crate) fn config_bytes(interfaces: &[TestInterface<'_>]) -> Vec<u8> {
        let mut bytes = vec![9, 2, 0, 0, interfaces.len() as u8, 1, 0, 0x80, 50];
        for &((number, alt, class, subclass, protocol), endpoints) in interfaces {
            bytes.extend_from_slice(&[
                9,
                4,
                number,
                alt,
                endpoints.len() as u8,
                class,
                subclass,
                protocol,
                0,
            ]);
            for &(address, attributes, max_packet) in endpoints {
                let [lo, hi] = max_packet.to_le_bytes();
                bytes.extend_from_slice(&[7, 5, address, attributes, lo, hi, 0]);
            }
        }
        let total = (bytes.len() as u16).to_le_bytes();
        bytes[2..4].copy_from_slice(&total);
        bytes
    }

    const BULK: u8 = 2;
    const INTERRUPT: u8 = 3;

    fn find(bytes: &[u8]) -> Option<AdbInterface> {
        find_adb_interface(&ConfigurationDescriptor::new(bytes).expect("valid descriptor"))
    }

    #[test]
    fn finds_adb_beside_other_functions() {
        // A phone in "file transfer" mode: MTP first, then ADB on interface 1.
        let bytes = config_bytes(&[
            (
                (0, 0, 0x06, 0x01, 0x01),
                &[(0x81, BULK, 512), (0x01, BULK, 512), (0x82, INTERRUPT, 28)],
            ),
            (
                (1, 0, 0xff, 0x42, 0x01),
                &[(0x02, BULK, 512), (0x83, BULK, 512)],
            ),
        ]);
        assert_eq!(
            find(&bytes),
            Some(AdbInterface {
                number: 1,
                alt_setting: 0,
                endpoint_in: 0x83,
                endpoint_out: 0x02,
            })
        );
    }

    #[test]
    fn rejects_wrong_class_triples_and_missing_endpoints() {
        // Fastboot (protocol 3) and a vendor interface with another subclass.
        let bytes = config_bytes(&[
            (
                (0, 0, 0xff, 0x42, 0x03),
                &[(0x81, BULK, 512), (0x01, BULK, 512)],
            ),
            (
                (1, 0, 0xff, 0x43, 0x01),
                &[(0x82, BULK, 512), (0x02, BULK, 512)],
            ),
        ]);
        assert_eq!(find(&bytes), None);
        // The right triple, but only an IN endpoint and an interrupt OUT one.
        let bytes = config_bytes(&[(
            (0, 0, 0xff, 0x42, 0x01),
            &[(0x81, BULK, 512), (0x01, INTERRUPT, 64)],
        )]);
        assert_eq!(find(&bytes), None);
        // No interfaces at all (an unconfigured gadget).
        assert_eq!(find(&config_bytes(&[])), None);
    }

    #[test]
    fn takes_the_first_bulk_pair_and_alternate_settings() {
        // Alt setting 0 has no endpoints; alt 1 carries the ADB pipes, with a
        // second bulk pair that is ignored.
        let bytes = config_bytes(&[
            ((0, 0, 0xff, 0x42, 0x01), &[]),
            (
                (0, 1, 0xff, 0x42, 0x01),
                &[
                    (0x81, BULK, 1024),
                    (0x01, BULK, 1024),
                    (0x82, BULK, 1024),
                    (0x02, BULK, 1024),
                ],
            ),
        ]);
        assert_eq!(
            find(&bytes),
            Some(AdbInterface {
                number: 0,
                alt_setting: 1,
                endpoint_in: 0x81,
                endpoint_out: 0x01,
            })
        );
    }
}
