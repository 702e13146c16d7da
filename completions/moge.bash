_moge() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="moge"
                ;;
            moge,batch)
                cmd="moge__subcmd__batch"
                ;;
            moge,bench)
                cmd="moge__subcmd__bench"
                ;;
            moge,colmap)
                cmd="moge__subcmd__colmap"
                ;;
            moge,compare)
                cmd="moge__subcmd__compare"
                ;;
            moge,download)
                cmd="moge__subcmd__download"
                ;;
            moge,generate-assets)
                cmd="moge__subcmd__generate__subcmd__assets"
                ;;
            moge,help)
                cmd="moge__subcmd__help"
                ;;
            moge,info)
                cmd="moge__subcmd__info"
                ;;
            moge,models)
                cmd="moge__subcmd__info"
                ;;
            moge,panorama)
                cmd="moge__subcmd__panorama"
                ;;
            moge,predict)
                cmd="moge__subcmd__predict"
                ;;
            moge,quantize)
                cmd="moge__subcmd__quantize"
                ;;
            moge,serve)
                cmd="moge__subcmd__serve"
                ;;
            moge__subcmd__help,batch)
                cmd="moge__subcmd__help__subcmd__batch"
                ;;
            moge__subcmd__help,bench)
                cmd="moge__subcmd__help__subcmd__bench"
                ;;
            moge__subcmd__help,colmap)
                cmd="moge__subcmd__help__subcmd__colmap"
                ;;
            moge__subcmd__help,compare)
                cmd="moge__subcmd__help__subcmd__compare"
                ;;
            moge__subcmd__help,download)
                cmd="moge__subcmd__help__subcmd__download"
                ;;
            moge__subcmd__help,generate-assets)
                cmd="moge__subcmd__help__subcmd__generate__subcmd__assets"
                ;;
            moge__subcmd__help,help)
                cmd="moge__subcmd__help__subcmd__help"
                ;;
            moge__subcmd__help,info)
                cmd="moge__subcmd__help__subcmd__info"
                ;;
            moge__subcmd__help,panorama)
                cmd="moge__subcmd__help__subcmd__panorama"
                ;;
            moge__subcmd__help,predict)
                cmd="moge__subcmd__help__subcmd__predict"
                ;;
            moge__subcmd__help,quantize)
                cmd="moge__subcmd__help__subcmd__quantize"
                ;;
            moge__subcmd__help,serve)
                cmd="moge__subcmd__help__subcmd__serve"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        moge)
            opts="-h -V --help --version predict batch panorama colmap serve bench compare quantize download info models generate-assets help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__batch)
            opts="-o -j -q -h --from-list --output --weights --model --revision --precision --device --num-tokens --resolution-level --fov-x --intrinsics --intrinsics-from --no-mask --no-force-projection --refine-steps --per-step --format --depth-scale --edge-rtol --npz-compression --npz-normal-dtype --no-compress --no-exif --max-megapixels --allow-truncated --server --in-flight --server-timeout --server-retries --every --fps --video-scale --video-fov --camera --camera-sample --shared-scale --fit --canvas --jobs --shard --skip-existing --quiet --json --stats --panorama --view-size --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --from-list)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --weights)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "auto f32 bf16 int8" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resolution-level)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fov-x)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics-from)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --refine-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "npz png json exr ply glb vis mp4 colmap" -- "${cur}"))
                    return 0
                    ;;
                --depth-scale)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --edge-rtol)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --npz-compression)
                    COMPREPLY=($(compgen -W "none fast small" -- "${cur}"))
                    return 0
                    ;;
                --npz-normal-dtype)
                    COMPREPLY=($(compgen -W "float32 float16" -- "${cur}"))
                    return 0
                    ;;
                --max-megapixels)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --in-flight)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server-retries)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --every)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --video-scale)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --video-fov)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --camera)
                    COMPREPLY=($(compgen -W "per-photo shared" -- "${cur}"))
                    return 0
                    ;;
                --camera-sample)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fit)
                    COMPREPLY=($(compgen -W "exact pad stretch" -- "${cur}"))
                    return 0
                    ;;
                --canvas)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -j)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --shard)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --view-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__bench)
            opts="-h --size --runs --warmup --weights --model --revision --precision --device --num-tokens --resolution-level --fov-x --intrinsics --intrinsics-from --no-mask --no-force-projection --refine-steps --per-step --json --host-only --format --depth-scale --edge-rtol --npz-compression --npz-normal-dtype --no-compress --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --runs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --warmup)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --weights)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "auto f32 bf16 int8" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resolution-level)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fov-x)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics-from)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --refine-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "npz png json exr ply glb vis mp4 colmap" -- "${cur}"))
                    return 0
                    ;;
                --depth-scale)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --edge-rtol)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --npz-compression)
                    COMPREPLY=($(compgen -W "none fast small" -- "${cur}"))
                    return 0
                    ;;
                --npz-normal-dtype)
                    COMPREPLY=($(compgen -W "float32 float16" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__colmap)
            opts="-o -j -q -h --images --output --format --weights --model --revision --precision --device --num-tokens --resolution-level --fov-x --intrinsics --intrinsics-from --no-mask --no-force-projection --refine-steps --per-step --no-exif --max-megapixels --allow-truncated --server --in-flight --server-timeout --server-retries --jobs --quiet --json --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --images)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "npz png json exr ply glb vis mp4 colmap" -- "${cur}"))
                    return 0
                    ;;
                --weights)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "auto f32 bf16 int8" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resolution-level)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fov-x)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics-from)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --refine-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-megapixels)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --in-flight)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server-retries)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -j)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__compare)
            opts="-h --json --min-pcc --max-depth-rel-median --max-depth-rel --min-mask-iou --max-fov-diff --max-scale-diff --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --min-pcc)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-depth-rel-median)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-depth-rel)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --min-mask-iou)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-fov-diff)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-scale-diff)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__download)
            opts="-h --model --revision --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__generate__subcmd__assets)
            opts="-h --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help)
            opts="predict batch panorama colmap serve bench compare quantize download info generate-assets help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__batch)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__bench)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__colmap)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__compare)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__download)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__generate__subcmd__assets)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__info)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__panorama)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__predict)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__quantize)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__help__subcmd__serve)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__info)
            opts="-h --json --revision --verify --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__panorama)
            opts="-o -q -h --from-list --output --view-size --server --json --quiet --shard --skip-existing --weights --model --revision --precision --device --num-tokens --resolution-level --fov-x --intrinsics --intrinsics-from --no-mask --no-force-projection --refine-steps --per-step --format --depth-scale --edge-rtol --npz-compression --npz-normal-dtype --no-compress --no-exif --max-megapixels --allow-truncated --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --from-list)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --view-size)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --shard)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --weights)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "auto f32 bf16 int8" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resolution-level)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fov-x)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics-from)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --refine-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "npz png json exr ply glb vis mp4 colmap" -- "${cur}"))
                    return 0
                    ;;
                --depth-scale)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --edge-rtol)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --npz-compression)
                    COMPREPLY=($(compgen -W "none fast small" -- "${cur}"))
                    return 0
                    ;;
                --npz-normal-dtype)
                    COMPREPLY=($(compgen -W "float32 float16" -- "${cur}"))
                    return 0
                    ;;
                --max-megapixels)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__predict)
            opts="-o -h --output --weights --model --revision --precision --device --num-tokens --resolution-level --fov-x --intrinsics --intrinsics-from --no-mask --no-force-projection --refine-steps --per-step --format --depth-scale --edge-rtol --npz-compression --npz-normal-dtype --no-compress --no-exif --max-megapixels --allow-truncated --server --in-flight --server-timeout --server-retries --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --weights)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "auto f32 bf16 int8" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --num-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --resolution-level)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --fov-x)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --intrinsics-from)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --refine-steps)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --format)
                    COMPREPLY=($(compgen -W "npz png json exr ply glb vis mp4 colmap" -- "${cur}"))
                    return 0
                    ;;
                --depth-scale)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --edge-rtol)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --npz-compression)
                    COMPREPLY=($(compgen -W "none fast small" -- "${cur}"))
                    return 0
                    ;;
                --npz-normal-dtype)
                    COMPREPLY=($(compgen -W "float32 float16" -- "${cur}"))
                    return 0
                    ;;
                --max-megapixels)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --in-flight)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --server-retries)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__quantize)
            opts="-o -h --weights --model --revision --output --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --weights)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --output)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -o)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        moge__subcmd__serve)
            opts="-j -h --weights --model --revision --precision --device --host --port --jobs --queue --max-body-mb --max-tokens --canvas --depth-scale --npz-compression --warmup --no-exif --max-megapixels --allow-truncated --help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --weights)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --model)
                    COMPREPLY=($(compgen -W "vits-normal vitb-normal vitl-normal vitl moge3-vitl moge3-vitg" -- "${cur}"))
                    return 0
                    ;;
                --revision)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --precision)
                    COMPREPLY=($(compgen -W "auto f32 bf16 int8" -- "${cur}"))
                    return 0
                    ;;
                --device)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --host)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --port)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -j)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --queue)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-body-mb)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-tokens)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --canvas)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --depth-scale)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --npz-compression)
                    COMPREPLY=($(compgen -W "none fast small" -- "${cur}"))
                    return 0
                    ;;
                --max-megapixels)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _moge -o nosort -o bashdefault -o default moge
else
    complete -F _moge -o bashdefault -o default moge
fi
