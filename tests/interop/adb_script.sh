# An adb user's everyday script, written for Google's adb 29. test_dropin.py
# runs it line by line against a fresh oxadbd twice: once as it is, once
# with `oxadb` in place of `adb`, and compares stdout, stderr and exit codes.
# $SERIAL is the daemon, $DEAD a closed port, $FWD a free local port,
# $ECHO an echo server's port, $DIR a private directory.
# A line ending in `#~` prints something that changes between runs (a log
# line): only its exit status and whether it wrote to stderr are compared.
adb start-server
adb connect $SERIAL
adb connect $SERIAL
adb connect 127.0.0.1:$DEAD
adb connect
adb devices
adb get-state
adb get-serialno
adb get-devpath
adb wait-for-device
adb shell echo hello
adb shell -n echo no stdin
adb shell -T echo no pty
adb shell -t true
adb shell -x 'echo out; echo err >&2; exit 3'
adb shell 'echo out; echo err >&2; exit 3'
adb shell exit 42
adb shell -e none echo escape
adb shell -e
adb shell getprop ro.product.model
adb push $DIR/hello.txt /tmp/oxadb-dropin-$FWD.txt
adb shell cat /tmp/oxadb-dropin-$FWD.txt
adb pull /tmp/oxadb-dropin-$FWD.txt $DIR/back.txt
adb shell rm /tmp/oxadb-dropin-$FWD.txt
adb pull /tmp/oxadb-dropin-$FWD.txt $DIR/missing.txt
adb forward tcp:$FWD tcp:$ECHO
adb forward --list
adb forward --no-rebind tcp:$FWD tcp:$ECHO
adb forward tcp:$FWD tcp:$ECHO
adb forward --remove tcp:$FWD
adb forward --remove tcp:$FWD
adb forward --list
adb forward tcp:$FWD tcp:$ECHO
adb forward --remove-all
adb forward --list
adb forward
adb forward tcp:$FWD
adb forward --list extra
adb reverse --list
adb logcat -d -t 1 #~
adb root
adb unroot
adb remount
adb reboot
adb reboot bootloader
adb usb
adb tcpip
adb tcpip abc
adb sync
adb install $DIR/app.apk
adb uninstall com.example.app
adb frobnicate
adb -s 127.0.0.1:$DEAD get-state
adb wait-for-device
adb disconnect $SERIAL
adb disconnect $SERIAL
adb connect $SERIAL
adb reconnect
adb disconnect
adb kill-server
