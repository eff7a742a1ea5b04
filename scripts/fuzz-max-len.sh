# Sourced by scripts/test.d/10-fuzz.sh and scripts/fuzz-campaign.sh: the largest input libFuzzer
# generates for a target (-max_len). Without it libFuzzer takes the largest seed, and the
# 100,000-byte regression inputs made every mutation of the text formats that large (tens of
# executions per second instead of thousands). 0: libFuzzer's default (checkpoints are whole files).
fuzz_max_len() {
  case $1 in
    safetensors_file) echo 0 ;;
    image_decode | preprocess) echo 40000 ;;
    safetensors) echo 65536 ;;
    oip_request) echo 16384 ;;
    *) echo 8192 ;;
  esac
}
