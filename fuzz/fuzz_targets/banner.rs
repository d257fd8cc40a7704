//! The CNXN banner (`kind:serial:key=value;...;features=a,b`), as the peer sends it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxadb_wire::banner::MAX_BANNER_LEN;
use oxadb_wire::{Banner, BannerError};

fuzz_target!(|data: &[u8]| {
    // A C string: the banner is what comes before the first NUL.
    let text = &data[..data.iter().position(|&b| b == 0).unwrap_or(data.len())];
    let banner = match Banner::parse(data) {
        Ok(banner) => banner,
        Err(BannerError::TooLong) => {
            assert!(data.len() > MAX_BANNER_LEN);
            return;
        }
        Err(BannerError::NotUtf8) => {
            assert!(std::str::from_utf8(text).is_err());
            return;
        }
        Err(BannerError::Malformed(_)) => {
            assert!(text.iter().filter(|&&b| b == b':').count() < 2);
            return;
        }
    };

    // The separators (and NULs) never end up inside a field.
    assert!(!banner.kind.contains(':') && !banner.serial.contains(':'));
    let fields = banner.properties.iter().flat_map(|(k, v)| [k, v]);
    for field in [&banner.kind, &banner.serial].into_iter().chain(fields) {
        assert!(!field.contains('\0'), "{field:?}");
    }
    for (key, value) in &banner.properties {
        assert!(!key.contains([';', '=']), "{key:?}");
        assert!(!value.contains(';'), "{value:?}");
        assert_ne!(key, "features");
        assert!(banner.property(key).is_some());
    }
    for feature in &banner.features {
        assert!(!feature.is_empty());
        assert!(!feature.contains([',', ';', '\0']), "{feature:?}");
        assert!(banner.has_feature(feature));
    }

    // What we parsed is what we would send: encoding and parsing again gives
    // the same banner, with or without the C string's NUL. Encoding can grow
    // a banner (`k` becomes `k=;`), so one near the limit may not fit again.
    let encoded = banner.encode();
    if encoded.len() < MAX_BANNER_LEN {
        assert_eq!(
            Banner::parse(encoded.as_bytes()).as_ref(),
            Ok(&banner),
            "encoded as {encoded:?}"
        );
        let mut with_nul = encoded.clone().into_bytes();
        with_nul.push(0);
        assert_eq!(Banner::parse(&with_nul).as_ref(), Ok(&banner));
    }
});
